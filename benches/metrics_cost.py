"""What per-node metrics cost the graph runtime: requests per second and p50 latency of the
engine alone (a three-model chain whose callers await once, as a handle call does) with
metrics off, with an observer that does nothing, and with the real observer over
`ray.serve.metrics` (a driver connected to a Ray head this script starts on 127.0.0.1).
Seven interleaved rounds of 3,000 sequential requests after a warm-up; medians. One run:

    ~/.cache/raypipe/ray/venv-2.60.0/bin/python benches/metrics_cost.py

Timings are for comparison within one run on one machine; nothing here asserts a time.
"""

import asyncio
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "runtime"), os.path.join(REPO, "runtime", "tests")]

from rayhead import LOOPBACK, RayHead, loopback_env  # noqa: E402

os.environ.update(loopback_env())

import ray  # noqa: E402

from raypipe_runtime import engine, metrics  # noqa: E402
from raypipe_runtime.spec import parse_graph_text  # noqa: E402


def model(name):
    return {"name": name, "model": {"import_path": f"bench.models:{name}"}}


GRAPH = parse_graph_text({
    "name": "bench", "version": "1", "ingress": "request", "labels": {"team": "bench"},
    "nodes": [{"name": "request", "input": {}}, model("a"), model("b"), model("c"),
              {"name": "response", "output": {}}],
    "edges": [{"source": s, "target": t}
              for s, t in (("request", "a"), ("a", "b"), ("b", "c"), ("c", "response"))],
})


async def call(document):
    await asyncio.sleep(0)
    return document


async def timed(executor, n):
    latencies = []
    started = time.perf_counter()
    for _ in range(n):
        begin = time.perf_counter()
        result = await executor.run({"n": 1})
        latencies.append(time.perf_counter() - begin)
        assert result.status == 200
    return n / (time.perf_counter() - started), statistics.median(latencies) * 1e6


async def main(observers):
    executors = {name: engine.Executor(GRAPH, {n: call for n in "abc"}, observer=observer)
                 for name, observer in observers.items()}
    for executor in executors.values():
        await timed(executor, 500)
    results = {name: [] for name in executors}
    for _ in range(7):
        for name, executor in executors.items():
            results[name].append(await timed(executor, 3000))
    off_rps = statistics.median(r for r, _ in results["off"])
    for name, runs in results.items():
        rps = statistics.median(r for r, _ in runs)
        p50 = statistics.median(p for _, p in runs)
        print(f"{name:12} {rps:9.0f} requests/s  p50 {p50:6.1f} µs  ratio to off {rps / off_rps:.2f}")


if __name__ == "__main__":
    head = RayHead(python_path=[])
    try:
        head.wait_started()
        ray.init(address=head.gcs_address, _node_ip_address=LOOPBACK, logging_level="warning",
                 log_to_driver=False)
        asyncio.run(main({"off": None, "no-op": engine.Observer(),
                          "ray metrics": metrics.ray_observer(GRAPH)}))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.stop()
