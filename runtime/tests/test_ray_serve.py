"""End to end on a real Ray (the pinned ray[serve] of raypipe's test venv) on 127.0.0.1 only:
the application built from the rendered ensemble args is `serve.run` and answers over HTTP on
the loopback Serve port.

Skipped when Ray is not importable (e.g. a plain `python -m pytest` outside the venv), unless
RAYPIPE_REQUIRE_RAY=1 (set by tests/integration/runtime.rs) turns that into a failure.
"""

import os
import time

import pytest

from conftest import REPO_ROOT, RUNTIME_DIR, rendered
from loopback_http import post
from rayhead import LOOPBACK, RayHead, loopback_env

# conftest.py has set the loopback environment before anything imported Ray; check it held.
assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == loopback_env()["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]

try:
    import ray  # noqa: F401
    from ray import serve
except ImportError:  # pragma: no cover - depends on the interpreter
    if os.environ.get("RAYPIPE_REQUIRE_RAY") == "1":
        raise
    pytest.skip("ray[serve] is not installed in this interpreter", allow_module_level=True)

@pytest.fixture(scope="module")
def head():
    head = RayHead(python_path=[REPO_ROOT, RUNTIME_DIR])
    try:
        head.wait_started()
        # The address is given, so ray.init only connects (it never starts a Ray of its own).
        ray.init(address=head.gcs_address, _node_ip_address=LOOPBACK, logging_level="warning",
                 log_to_driver=False)
        serve.start(http_options={"host": LOOPBACK, "port": head.ports["serve_http"]},
                    proxy_location="HeadOnly")
        yield head
    finally:
        # Only when connected: serve.shutdown() would otherwise start a local Ray of its own.
        if ray.is_initialized():
            try:
                serve.shutdown()
            except Exception:
                pass
            ray.shutdown()
        head.stop()


def test_ensemble_answers_over_http(head):
    from raypipe_runtime.app import build

    (app,) = rendered("ensemble")["applications"]
    started = time.monotonic()
    serve.run(build(app["args"]), name=app["name"], route_prefix=app["route_prefix"],
              blocking=False)
    deploy_s = time.monotonic() - started
    url = head.serve_url + app["route_prefix"]

    status, body, headers = post(url, {"text": "I LOVE this  great product"})
    assert (status, body) == (200, {"score": 0.7, "votes": {"a": 0.7, "b": 0.7}}), (status, body)
    assert headers.get("x-raypipe-graph") == "ensemble@1"

    # model_b is soft (on_error SKIP, optional edge): the ensemble answers without it.
    status, body, headers = post(url, {"text": "good product fail:b"})
    assert (status, body) == (200, {"score": 0.6667, "votes": {"a": 0.6667}}), (status, body)
    assert headers.get("x-raypipe-partial") == "model_b"

    # model_a is hard: the error names it and carries no model output.
    status, body, _ = post(url, {"text": "fail:a"})
    assert status == 502, body
    assert body["error"]["node"] == "model_a"
    assert body["error"]["code"] == "NODE_FAILED"
    assert "classifier a was asked to fail" in body["error"]["message"]

    # Every deployment is named as the rendered config names them.
    status_info = serve.status().applications[app["name"]]
    assert set(status_info.deployments) == {d["name"] for d in app["deployments"]}

    # Everything the head (and this driver) listens on is loopback.
    addresses = head.listening_addresses(extra_pids=[os.getpid()])
    assert addresses, "found no listening sockets of the head"
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for ip, _ in addresses), addresses
    print(f"ensemble deployed in {deploy_s:.1f}s")
