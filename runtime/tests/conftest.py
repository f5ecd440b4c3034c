"""Shared helpers of the graph runtime's tests.

Run from the repository root with the Ray venv's Python (what `cargo test --test integration
runtime::` does):

    PYTHONPATH=.:runtime ~/.cache/raypipe/ray/venv-2.60.0/bin/python -m pytest runtime/tests -q

(`venv-2.52.0` for the oldest Ray the README's support matrix claims; `cargo test --test
integration runtime::` runs the suite on both.)

Everything except test_ray_serve.py, test_router_ray.py, test_metrics_ray.py and
test_serve_semantics_ray.py runs without Ray.
"""

import asyncio
import json
import os
import sys
from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = RUNTIME_DIR.parent
for path in (str(REPO_ROOT), str(RUNTIME_DIR)):
    if path not in sys.path:
        sys.path.insert(0, path)

# Before any test module imports Ray: Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, at
# import, and without it a driver looks for a 127.0.0.1 head on the host's interface address.
from rayhead import loopback_env  # noqa: E402

os.environ.update(loopback_env())

FIXTURES = Path(__file__).resolve().parent / "fixtures"
VECTORS = REPO_ROOT / "tests" / "vectors"
SAMPLES = ("sequence", "ensemble", "switch-canary")


def rendered(name: str) -> dict:
    """The Serve config `raypipe dag render --json samples/graphs/<name>.yaml` prints (checked in
    under fixtures/rendered; tests/integration/runtime.rs fails when it drifts)."""
    return json.loads((FIXTURES / "rendered" / f"{name}.json").read_text())


def rendered_args(name: str) -> dict:
    return rendered(name)["applications"][0]["args"]


def run(coro, timeout: float = 20.0):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())
