"""What a new graph version starts, inline versus shared node applications (issue 32), on a
real local Ray: replicas started and the time from the first Serve config write to the new
version serving, for three changes and both strategies.

Not a test and not run by CI: run it by hand, alone on the machine if you can, with the Ray
venv's Python from the repository root:

    ~/.cache/raypipe/ray/venv-2.60.0/bin/python benches/shared_nodes.py [--load-s 3] [--raypipe BIN]

Method. One Ray head on 127.0.0.1 (as the runtime's tests start theirs). The graph is a chain
of five model nodes (`shared_nodes_models:SlowStart`, whose constructor sleeps `--load-s`
seconds, standing for loading weights), each a deployment of its own. The configs are what
`raypipe dag render --json` prints for each version, without and with `--shared-nodes`, and are
written to the dashboard in the order raypipe's operator writes them:

- Immediate, inline: the new config at once (Serve rolls the application over).
- Immediate, shared: the new node applications beside the serving wiring; once they run, the
  executor's new wiring (the previous nodes kept); then the previous nodes dropped
  (src/controllers/servepipeline/shared.rs).
- Canary: the new version as an application beside the serving one (inline: with all its
  nodes; shared: its executor and the node applications it does not share), until it runs:
  what a canary waits for before it takes its first share. (The router's steps and gates come
  after that and are the policy's, not the layout's.)

Changes: (a) wiring only (the version label and a node's timeout), (b) one of five nodes
changed (its init arguments), (c) all five changed. Each case starts from a fresh deployment
of version 1. "Replicas started" counts the replica ids Serve reports afterwards that were not
there before. "To serving" is from the first config write to the first HTTP answer from the
new version (Immediate), or to the canary's applications all RUNNING (Canary). A client sends
requests back to back to the route throughout Immediate; every answer that is not 200 is a
failed request.

The machine (CPU model, cores, load) and the versions are printed first; compare within one
run, never across machines.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNTIME_DIR = REPO_ROOT / "runtime"
BENCHES = REPO_ROOT / "benches"
sys.path.insert(0, str(RUNTIME_DIR / "tests"))

from loopback_http import post
from rayhead import RayHead, loopback_env
from serve_rest import ServeRest

os.environ.update(loopback_env())

NODES = ("n1", "n2", "n3", "n4", "n5")
CASES = {
    "a": "wiring only (version label, a node's timeout)",
    "b": "one of five nodes changed",
    "c": "all five nodes changed",
}


def graph(version: str, load_s: float, tags: dict) -> dict:
    nodes = [{"name": "request", "input": {}}]
    for name in NODES:
        nodes.append(
            {
                "name": name,
                "timeout_ms": 20000,
                "model": {
                    "import_path": "shared_nodes_models:SlowStart",
                    "init_kwargs": {"load_s": load_s, "tag": tags.get(name, f"{name}-1")},
                    "deployment": {"ray_actor_options": {"num_cpus": 0.1}},
                },
            }
        )
    nodes.append({"name": "response", "output": {}})
    chain = ["request", *NODES, "response"]
    return {
        "name": "bench",
        "version": version,
        "ingress": "request",
        "route_prefix": "/bench",
        "deadline_ms": 30000,
        "fuse": False,
        "nodes": nodes,
        "edges": [{"source": a, "target": b} for a, b in zip(chain, chain[1:])],
    }


def versions(load_s: float) -> dict:
    base = graph("1", load_s, {})
    wiring = graph("a", load_s, {})
    wiring["nodes"][2]["timeout_ms"] = 15000
    return {
        "1": base,
        "a": wiring,
        "b": graph("b", load_s, {"n3": "n3-2"}),
        "c": graph("c", load_s, {n: f"{n}-3" for n in NODES}),
    }


def render(raypipe: list, text: dict, shared: bool, workdir: Path) -> dict:
    path = workdir / f"{text['version']}.json"
    path.write_text(json.dumps(text))
    args = [*raypipe, "dag", "render", "--json", str(path)] + (["--shared-nodes"] if shared else [])
    out = subprocess.run(args, check=True, capture_output=True, cwd=REPO_ROOT)
    return json.loads(out.stdout)


class Client:
    """Posts to the route back to back; counts failures and the newest graph label seen."""

    def __init__(self, url: str):
        self.url, self.stop, self.lock = url, threading.Event(), threading.Lock()
        self.total, self.failed, self.label = 0, 0, None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            try:
                status, _, headers = post(self.url, {"seen": []}, timeout=60)
            except OSError:
                status, headers = None, {}
            with self.lock:
                self.total += 1
                if status == 200:
                    self.label = headers.get("x-raypipe-graph")
                else:
                    self.failed += 1

    def wait_label(self, label: str, timeout: float = 300.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with self.lock:
                if self.label == label:
                    return time.monotonic()
            time.sleep(0.01)
        raise AssertionError(f"no answer from {label} (last {self.label})")

    def close(self):
        self.stop.set()
        self.thread.join(timeout=120)


def all_replicas(serve: ServeRest) -> set:
    return {(app, d, r) for app, ds in serve.replicas().items() for d, rs in ds.items() for r in rs}


def started(before: set, serve: ServeRest) -> int:
    return len({r for _, _, r in all_replicas(serve)} - {r for _, _, r in before})


def deploy_fresh(serve: ServeRest, config: dict) -> None:
    serve.put({**config, "applications": []})
    deadline = time.monotonic() + 120
    while serve.applications() and time.monotonic() < deadline:
        time.sleep(0.2)
    serve.put(config)
    serve.wait_apps([a["name"] for a in config["applications"]])


def immediate(serve: ServeRest, old: dict, new: dict, shared: bool, label: str) -> tuple:
    client = Client(serve.head.serve_url + "/bench")
    try:
        client.wait_label("bench@1")
        before = all_replicas(serve)
        if not shared:
            first = serve.put(new)
            serving = client.wait_label(label)
            serve.wait_apps([a["name"] for a in new["applications"]])
        else:
            old_version, *old_nodes = old["applications"]
            version, *nodes = new["applications"]
            fresh = [n for n in nodes if n["name"] not in {o["name"] for o in old_nodes}]
            first = time.monotonic()
            if fresh:
                staged = {**new, "applications": [old_version, *old_nodes, *fresh]}
                first = serve.put(staged)
                serve.wait_apps([n["name"] for n in fresh])
            kept = [o for o in old_nodes if o["name"] not in {n["name"] for n in nodes}]
            switch = serve.put({**new, "applications": [version, *nodes, *kept]})
            first = min(first, switch)
            serving = client.wait_label(label)
            serve.wait_apps([version["name"]])
            time.sleep(1.0)
            serve.put(new)
            serve.wait_apps([k["name"] for k in kept], present=False)
        count = started(before, serve)
    finally:
        client.close()
    return count, serving - first, client.total, client.failed


def canary(serve: ServeRest, old: dict, new: dict, shared: bool, label: str) -> tuple:
    before = all_replicas(serve)
    version, *nodes = copy.deepcopy(new["applications"])
    version["name"], version["route_prefix"] = "bench--canary", None
    old_names = {a["name"] for a in old["applications"]}
    added = [version] + [n for n in nodes if n["name"] not in old_names]
    first = serve.put({**new, "applications": [*old["applications"], *added]})
    serve.wait_apps([a["name"] for a in added])
    return started(before, serve), time.monotonic() - first, 0, 0


def machine() -> str:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"
    )
    import ray

    return (
        f"{platform.node()}: {cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
        f"Python {platform.python_version()}, Ray {ray.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-s", type=float, default=3.0, help="seconds each node's constructor sleeps")
    parser.add_argument("--raypipe", default="cargo run --quiet --", help="command that runs raypipe")
    parser.add_argument("--cases", default="a,b,c")
    args = parser.parse_args()
    raypipe = shlex.split(args.raypipe)
    print(machine(), flush=True)
    head = RayHead(python_path=[REPO_ROOT, RUNTIME_DIR, BENCHES], num_cpus=16)
    rows = []
    try:
        head.wait_started()
        serve = ServeRest(head)
        with tempfile.TemporaryDirectory() as tmp:
            texts = versions(args.load_s)
            for layout in ("inline", "shared"):
                shared = layout == "shared"
                configs = {v: serve.on_loopback(render(raypipe, t, shared, Path(tmp))) for v, t in texts.items()}
                for strategy in ("Immediate", "Canary"):
                    for case in args.cases.split(","):
                        old, new = configs["1"], configs[case]
                        deploy_fresh(serve, old)
                        run = immediate if strategy == "Immediate" else canary
                        count, seconds, total, failed = run(serve, old, new, shared, f"bench@{case}")
                        row = (layout, strategy, case, count, seconds, total, failed)
                        rows.append(row)
                        print(
                            f"{layout:7} {strategy:9} ({case}) {CASES[case]:45} replicas started {count:3}  "
                            f"to serving {seconds:6.2f} s  requests {total:5} failed {failed}",
                            flush=True,
                        )
    finally:
        head.stop()
    print("\n| change | strategy | inline: replicas started | shared | inline: to serving | shared | ratio |")
    print("|---|---|---|---|---|---|---|")
    by = {(r[0], r[1], r[2]): r for r in rows}
    for strategy in ("Immediate", "Canary"):
        for case in args.cases.split(","):
            i, s = by.get(("inline", strategy, case)), by.get(("shared", strategy, case))
            if i and s:
                ratio = s[4] / i[4] if i[4] > 0 else float("nan")
                print(f"| ({case}) {CASES[case]} | {strategy} | {i[3]} | {s[3]} | {i[4]:.2f} s | {s[4]:.2f} s | {ratio:.2f} |")


if __name__ == "__main__":
    main()
