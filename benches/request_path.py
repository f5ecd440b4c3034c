"""The request path end to end on a real local Ray: raypipe fused, raypipe unfused, hand-written
Serve and the in-process limit, for three graphs, in default and throughput-optimised Serve.

Not a test and not run by CI: run it by hand, alone on the machine if you can, with the Ray
venv's Python from the repository root:

    ~/.cache/raypipe/ray/venv-2.60.0/bin/python benches/request_path.py [--rounds 3] [--raypipe BIN]

Method. For each Serve mode (see below; set in the head's
environment, which Serve reads at import in every process) one Ray head starts on 127.0.0.1
(as the runtime's tests start theirs) and one Serve config holds twelve applications: three
graphs (a three-model chain; a fan-out of two models joined by a third; a switch choosing one
of two models, feeding a third) times four variants:

- `fused`: the graph rendered by `raypipe dag render --json` with no deployment options, so
  every model node runs inside the executor (src/serve/fuse.rs);
- `unfused`: the same graph with `fuse: false` (and `max_ongoing_requests: 100` per node), so
  each model is a deployment the executor calls by handle;
- `hand`: the same graph hand-written with Serve DeploymentHandles (request_path_models.py);
- `limit`: the three models called in-process inside the one deployment that takes HTTP.

Modes: `default`; `throughput` (`RAY_SERVE_THROUGHPUT_OPTIMIZED=1`); `throughput-raypipe` (the
same with raypipe's Serve defaults, as in a RayCluster whose user opted into throughput mode:
`RAY_SERVE_ENABLE_DIRECT_INGRESS=0`, since direct ingress forces Serve's proxy onto the head
node only, and `RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=1`, which keeps bounded queues bounded;
see serve::SERVE_ENV_DEFAULTS); `throughput-raypipe-shared-loop` (direct ingress off, the router
on the replica's loop as throughput mode has it), to see what the router setting costs.

Models are no-op coroutines; every deployment takes 100 requests at once. Requests go through
Serve's HTTP proxy on the head. Each round visits every application in a fresh random order
(interleaved, so drifting machine load hits all alike): `--requests` sequential requests from
one client (p50/p99 latency), then `--seconds` of closed-loop load from 8 and from 32 client
threads (answers per second; every non-200 is counted and reported). The table gives the
median over rounds of each round's figure, and the ratios the issue asks for.

The machine (CPU model, cores, load) and the versions are printed first; timings compare
variants within one run on one machine, never across machines. Also printed per mode: any
TCP port a Ray process listens on beyond loopback (should be none).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNTIME_DIR = REPO_ROOT / "runtime"
BENCHES = REPO_ROOT / "benches"
sys.path.insert(0, str(RUNTIME_DIR / "tests"))

from rayhead import LOOPBACK, RayHead, loopback_env  # noqa: E402

os.environ.update(loopback_env())

GRAPHS = ("chain", "fanout", "switch")
VARIANTS = ("fused", "unfused", "hand", "limit")
BODY = json.dumps({"tier": "gold", "text": "a no-op model answers this"}).encode()
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def graph_text(kind: str, fused: bool) -> dict:
    def model(name):
        node = {"name": name, "model": {"import_path": "request_path_models:Echo"}}
        if not fused:
            node["model"]["deployment"] = {"max_ongoing_requests": 100}
        return node

    nodes = [{"name": "request", "input": {}}]
    if kind == "chain":
        nodes += [model("a"), model("b"), model("c")]
        edges = [("request", "a"), ("a", "b"), ("b", "c"), ("c", "response")]
    elif kind == "fanout":
        nodes += [model("a"), model("b"), model("c")]
        edges = [("request", "a"), ("request", "b"), ("a", "c", {"into": "/a"}), ("b", "c", {"into": "/b"}),
                 ("c", "response")]
    else:
        nodes += [{"name": "route", "switch": {}}, model("a"), model("b"), {**model("c"), "join": "ANY"}]
        gold = {"compare": {"path": "/request/tier", "op": "EQ", "value": "gold"}}
        edges = [("request", "route"), ("route", "a", {"when": gold}), ("route", "b"), ("a", "c"), ("b", "c"),
                 ("c", "response")]
    nodes.append({"name": "response", "output": {}})
    text = {
        "name": f"{kind}-{'fused' if fused else 'unfused'}", "version": "1", "ingress": "request",
        "nodes": nodes,
        "edges": [{"source": e[0], "target": e[1], **(e[2] if len(e) > 2 else {})} for e in edges],
    }
    if not fused:
        text["fuse"] = False
    return text


def render(raypipe: list, kind: str, fused: bool, workdir: Path) -> dict:
    path = workdir / f"{kind}-{fused}.json"
    path.write_text(json.dumps(graph_text(kind, fused)))
    out = subprocess.run([*raypipe, "dag", "render", "--json", str(path)], check=True, capture_output=True,
                         cwd=REPO_ROOT)
    (app,) = json.loads(out.stdout)["applications"]
    expected = ["a", "b", "c"] if fused else []
    assert app["args"].get("fused_nodes", []) == expected, app["args"]
    return app


def serve_config(raypipe: list, port: int, workdir: Path) -> dict:
    apps = []
    for kind in GRAPHS:
        for variant in VARIANTS:
            name = f"{kind}-{variant}"
            if variant in ("fused", "unfused"):
                app = render(raypipe, kind, variant == "fused", workdir)
                app["name"], app["route_prefix"] = name, f"/{name}"
            else:
                app = {"name": name, "route_prefix": f"/{name}",
                       "import_path": f"request_path_models:{variant}_{kind}"}
            apps.append(app)
    return {"proxy_location": "HeadOnly", "http_options": {"host": LOOPBACK, "port": port}, "applications": apps}


def dashboard(head, method: str, path: str, body=None, timeout: float = 60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{LOOPBACK}:{head.ports['dashboard']}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    with HTTP.open(req, timeout=timeout) as response:
        raw = response.read()
    return json.loads(raw) if raw.strip() else None


def deploy(head, config: dict, timeout: float = 600) -> None:
    deadline = time.monotonic() + 120
    while True:  # the dashboard's Serve API answers a little after the head is up
        try:
            dashboard(head, "PUT", "/api/serve/applications/", config)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        details = dashboard(head, "GET", "/api/serve/applications/")
        states = {name: app["status"] for name, app in (details.get("applications") or {}).items()}
        failed = {n: s for n, s in states.items() if s == "DEPLOY_FAILED"}
        if failed:
            raise RuntimeError(f"deploy failed: {json.dumps(details['applications'], indent=1)[:4000]}")
        if len(states) == len(config["applications"]) and all(s == "RUNNING" for s in states.values()):
            return
        time.sleep(2)
    raise TimeoutError(f"applications not RUNNING after {timeout}s")


def post(conn: http.client.HTTPConnection, path: str) -> int:
    conn.request("POST", path, BODY, {"content-type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def one_client(port: int, path: str, count: int):
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=60)
    latencies, errors = [], 0
    try:
        for _ in range(count):
            started = time.perf_counter()
            status = post(conn, path)
            latencies.append((time.perf_counter() - started) * 1000)
            errors += status != 200
    finally:
        conn.close()
    latencies.sort()
    return latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], errors


def saturate(port: int, path: str, clients: int, seconds: float):
    counts = [0] * clients
    errors = [0] * clients
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def run(i):
        conn = http.client.HTTPConnection(LOOPBACK, port, timeout=60)
        start.wait()
        try:
            while time.perf_counter() < stop_at[0]:
                status = post(conn, path)
                counts[i] += 1
                errors[i] += status != 200
        finally:
            conn.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + seconds
    started = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    took = time.perf_counter() - started
    return sum(counts) / took, sum(errors)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    import ray

    return (f"{model}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; Linux {platform.release()}; "
            f"Python {platform.python_version()}; Ray {ray.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def bench_mode(mode: str, args, raypipe: list, workdir: Path) -> dict:
    for name in ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_DIRECT_INGRESS",
                 "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"):
        os.environ.pop(name, None)
    if mode.startswith("throughput"):
        os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
    if mode.startswith("throughput-raypipe"):  # raypipe's RayClusters with throughput mode opted into
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0"
    if mode == "throughput-raypipe":  # raypipe keeps each router on its own loop
        os.environ["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] = "1"
    head = RayHead(python_path=[REPO_ROOT, RUNTIME_DIR, BENCHES], num_cpus=64)
    results = {}
    try:
        head.wait_started()
        port = head.ports["serve_http"]
        deploy(head, serve_config(raypipe, port, workdir))
        exposed = [a for a in head.listening_addresses() if a[0] not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
        print(f"[{mode}] deployed; listening beyond loopback: {exposed or 'nothing'}", flush=True)
        names = [f"{g}-{v}" for g in GRAPHS for v in VARIANTS]
        for name in names:  # warm: connections, handles, routers
            one_client(port, f"/{name}", 50)
        rng = random.Random(args.seed)
        for round_no in range(args.rounds):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                p50, p99, e1 = one_client(port, f"/{name}", args.requests)
                rps8, e8 = saturate(port, f"/{name}", 8, args.seconds)
                rps32, e32 = saturate(port, f"/{name}", 32, args.seconds)
                results.setdefault(name, []).append((p50, p99, rps8, rps32, e1 + e8 + e32))
            print(f"[{mode}] round {round_no + 1}/{args.rounds} done (load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        head.stop()
    return results


def report(mode: str, results: dict) -> str:
    med = {name: [statistics.median(r[i] for r in rows) for i in range(4)] + [sum(r[4] for r in rows)]
           for name, rows in results.items()}
    lines = [f"### Serve {mode}", "",
             "| graph | variant | p50 ms | p99 ms | req/s at 8 | req/s at 32 | non-200 |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for g in GRAPHS:
        for v in VARIANTS:
            p50, p99, rps8, rps32, errors = med[f"{g}-{v}"]
            lines.append(f"| {g} | {v} | {p50:.2f} | {p99:.2f} | {rps8:.0f} | {rps32:.0f} | {errors} |")
    lines += ["", "| graph | fused/limit req/s (8, 32) | unfused/hand req/s (8, 32) | fused/unfused p50 |",
              "|---|---:|---:|---:|"]
    for g in GRAPHS:
        f, u, h, lim = (med[f"{g}-{v}"] for v in VARIANTS)
        lines.append(f"| {g} | {f[2] / lim[2]:.2f}, {f[3] / lim[3]:.2f} | {u[2] / h[2]:.2f}, {u[3] / h[3]:.2f} "
                     f"| {f[0] / u[0]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per round (one client)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of load per concurrency per round")
    parser.add_argument("--modes", default="default,throughput,throughput-raypipe",
                        help="default; throughput (RAY_SERVE_THROUGHPUT_OPTIMIZED=1); throughput-raypipe "
                             "(with raypipe's Serve defaults); throughput-raypipe-shared-loop (router on the replica's loop)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--raypipe", default="cargo run --quiet --",
                        help="command that runs raypipe (default: cargo run from the repository)")
    args = parser.parse_args()
    raypipe = shlex.split(args.raypipe)
    print(f"machine: {machine()}", flush=True)
    print(f"method: {args.rounds} interleaved rounds; {args.requests} sequential requests, then "
          f"{args.seconds:g} s at 8 and at 32 clients, per application and round", flush=True)
    with tempfile.TemporaryDirectory(prefix="rp-bench-") as tmp:
        out = []
        for mode in args.modes.split(","):
            out.append(report(mode, bench_mode(mode, args, raypipe, Path(tmp))))
            print(out[-1], flush=True)
    print(f"\nload at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
