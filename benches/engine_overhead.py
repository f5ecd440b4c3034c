"""The graph runtime's own cost per request: the engine alone, no Ray, no HTTP.

Runs `raypipe_runtime.engine.Executor` for three graphs (a three-model chain, a fan-out of two
models joined by a third, a switch that picks one of two models feeding a third) with node
callers that are plain coroutines answering at once, and reports per request:

- microseconds of wall time (median and best of the rounds), sequential requests on one loop;
- Python function calls and C calls (`sys.setprofile` events), asyncio tasks created (a task
  factory), timers scheduled and event-loop turns (calls of asyncio's `call_at` and
  `_run_once`; uvloop does both in C, so they show as n/a there).

Two caller styles: `at once` (the coroutine returns without awaiting anything: the engine's
cost alone) and `suspends` (the caller awaits one `asyncio.sleep(0)`, as a call over a
DeploymentHandle always suspends, so loop turns show).

With `--baseline REV` the runtime package of git revision REV is loaded beside the working
tree's (as `raypipe_runtime_base`), and both run in the same process, round after round in
alternating order, so machine load hits both alike. `--uvloop` runs on uvloop, the loop Serve
replicas use when it is installed (as with ray[serve]). One run:

    ~/.cache/raypipe/ray/venv-2.60.0/bin/python benches/engine_overhead.py --baseline main [--uvloop]

Timings are for comparison on one machine in one run; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = "runtime/raypipe_runtime"


def model(name, **extra):
    return {"name": name, "model": {"import_path": f"bench.models:{name}"}, **extra}


def graph_text(nodes, edges, output=None):
    return {
        "name": "bench",
        "version": "1",
        "ingress": "request",
        "nodes": [{"name": "request", "input": {}}, *nodes, {"name": "response", "output": {}, **(output or {})}],
        "edges": [dict(zip(("source", "target"), e)) if isinstance(e, tuple) else e for e in edges],
    }


GRAPHS = {
    "chain": graph_text(
        [model("a"), model("b"), model("c")],
        [("request", "a"), ("a", "b"), ("b", "c"), ("c", "response")],
    ),
    "fan-out/join": graph_text(
        [model("a"), model("b"), model("c")],
        [("request", "a"), ("request", "b"),
         {"source": "a", "target": "c", "into": "/a"},
         {"source": "b", "target": "c", "into": "/b"},
         ("c", "response")],
    ),
    "switch": graph_text(
        [{"name": "s", "switch": {}}, model("a"), model("b"), model("c", join="ANY")],
        [("request", "s"),
         {"source": "s", "target": "a", "when": {"compare": {"path": "/request/n", "op": "GT", "value": 0}}},
         {"source": "s", "target": "b"},
         ("a", "c"), ("b", "c"), ("c", "response")],
    ),
}
REQUEST = {"n": 1, "text": "a short request"}


async def answer_at_once(document):
    return document


async def answer_after_one_suspension(document):
    await asyncio.sleep(0)
    return document


CALLERS = {"at once": answer_at_once, "suspends": answer_after_one_suspension}


def load_package(name: str, directory: Path):
    """Imports the runtime package found in `directory` under the module name `name`."""
    spec = importlib.util.spec_from_file_location(name, directory / "__init__.py",
                                                  submodule_search_locations=[str(directory)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.engine"), importlib.import_module(f"{name}.spec")


def baseline_package(revision: str, into: Path) -> Path:
    """Writes the runtime package of a git revision into `into` and returns its directory."""
    listing = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-tree", "--name-only", f"{revision}:{PACKAGE_DIR}"],
                             check=True, capture_output=True, text=True).stdout.split()
    target = into / "raypipe_runtime_base"
    target.mkdir()
    for name in listing:
        if name.endswith(".py"):
            text = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"{revision}:{PACKAGE_DIR}/{name}"],
                                  check=True, capture_output=True, text=True).stdout
            (target / name).write_text(text)
    return target


def executors(engine, spec, caller):
    out = {}
    for name, text in GRAPHS.items():
        graph = spec.parse_graph_text(text)
        callers = {n.name: caller for n in graph.model_nodes()}
        out[name] = engine.Executor(graph, callers)
    return out


async def check(executor):
    result = await executor.run(REQUEST)
    if result.status != 200:
        raise SystemExit(f"the benchmark graph failed: {result.status} {result.body}")


async def timed(executor, requests: int) -> float:
    """Microseconds per request over `requests` sequential requests."""
    run = executor.run
    gc.collect()
    started = time.perf_counter()
    for _ in range(requests):
        await run(REQUEST)
    return (time.perf_counter() - started) / requests * 1e6


class Counter:
    """A profile hook counting Python calls, C calls and a few asyncio functions by name."""

    WATCHED = {"call_at": "timers", "_run_once": "loop turns"}

    def __init__(self):
        self.counts = {"py calls": 0, "c calls": 0, "tasks": 0, "timers": 0, "loop turns": 0}

    def __call__(self, frame, event, _arg):
        if event == "call":
            self.counts["py calls"] += 1
            code = frame.f_code
            key = self.WATCHED.get(code.co_name)
            if key and "asyncio" in code.co_filename:
                self.counts[key] += 1
        elif event == "c_call":
            self.counts["c calls"] += 1


async def counted(executor, requests: int) -> dict:
    counter = Counter()
    run = executor.run
    loop = asyncio.get_running_loop()

    def count_task(loop, coro, **kwargs):
        counter.counts["tasks"] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(count_task)
    # Let the loop go round once under the hook's eyes so the count holds only what requests do.
    await asyncio.sleep(0)
    sys.setprofile(counter)
    try:
        for _ in range(requests):
            await run(REQUEST)
        await asyncio.sleep(0)
    finally:
        sys.setprofile(None)
        loop.set_task_factory(None)
    counts = {k: v / requests for k, v in counter.counts.items()}
    if not isinstance(loop, asyncio.BaseEventLoop):  # uvloop: timers and turns are C, unseen
        counts["timers"] = counts["loop turns"] = None
    return counts


async def main(args) -> None:
    variants = {}
    if args.baseline:
        temp = Path(tempfile.mkdtemp(prefix="rp-engine-bench-"))
        variants[f"baseline ({args.baseline})"] = load_package("raypipe_runtime_base", baseline_package(args.baseline, temp))
    variants["working tree"] = load_package("raypipe_runtime", REPO_ROOT / PACKAGE_DIR)
    cases = [(variant, style, graph) for variant in variants for style in CALLERS for graph in GRAPHS]
    built = {}
    for variant, (engine, spec) in variants.items():
        for style, caller in CALLERS.items():
            for graph, executor in executors(engine, spec, caller).items():
                built[(variant, style, graph)] = executor
                await check(executor)
                await timed(executor, args.requests // 10)  # warm-up

    samples = {case: [] for case in cases}
    for round_index in range(args.rounds):
        # Alternate the order every round so drift in machine load spreads over all cases.
        order = cases if round_index % 2 == 0 else list(reversed(cases))
        for case in order:
            samples[case].append(await timed(built[case], args.requests))
    counts = {case: await counted(built[case], args.count_requests) for case in cases}

    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    print(f"python {sys.version.split()[0]} ({loop} loop), {args.rounds} rounds x {args.requests} sequential requests per case, "
          f"counts over {args.count_requests} requests")
    header = ("engine", "callers", "graph", "µs median", "µs best", "py calls", "c calls", "tasks", "timers", "loop turns")
    rows = []
    for case in cases:
        times = samples[case]
        c = counts[case]
        seen = [("n/a" if c[k] is None else f"{c[k]:.1f}") for k in ("tasks", "timers", "loop turns")]
        rows.append((*case, f"{statistics.median(times):.1f}", f"{min(times):.1f}", f"{c['py calls']:.0f}",
                     f"{c['c calls']:.0f}", *seen))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-|-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(str(v).ljust(w) for v, w in zip(row, widths)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git revision whose runtime package runs beside the working tree's")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per case and round")
    parser.add_argument("--count-requests", type=int, default=200, help="requests per case under the profile hook")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop instead of asyncio's own loop")
    arguments = parser.parse_args()
    if arguments.uvloop:
        import uvloop

        uvloop.run(main(arguments))
    else:
        asyncio.run(main(arguments))
