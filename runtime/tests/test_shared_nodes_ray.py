"""Shared node applications on a real Ray (127.0.0.1 only), with the configs raypipe renders
(`raypipe dag render --shared-nodes`, checked in under fixtures/rendered and kept current by
tests/integration/runtime.rs), PUT to the dashboard in the order raypipe's operator writes
them, while a client sends requests without pause:

- a wiring-only change (a new version label and a node's timeout) reaches the executor in
  place: no replica of any application starts;
- a new version with one changed node (ensemble-v2: model_b's threshold) starts exactly that
  node's application: the new node is added beside the old one, the executor is switched to it,
  then the old one is removed; every other replica, the executor's too, keeps running;
- no request fails throughout.

Skipped when Ray is not importable, unless RAYPIPE_REQUIRE_RAY=1 (then it fails).
"""

import copy
import os
import threading
import time

import pytest
from conftest import REPO_ROOT, RUNTIME_DIR, rendered
from loopback_http import post
from rayhead import RayHead
from serve_rest import ServeRest

if os.environ.get("RAYPIPE_REQUIRE_RAY") != "1":
    pytest.importorskip("ray", reason="ray[serve] is not installed in this interpreter")

TESTS_DIR = RUNTIME_DIR / "tests"
BODY = {"text": "I LOVE this  great product"}


def split(config: dict):
    """(version application, {name: node application}) of a shared layout."""
    version, *nodes = config["applications"]
    return version, {n["name"]: n for n in nodes}


def node_map(version: dict) -> dict:
    (executor,) = version["deployments"]
    return executor["user_config"]["raypipe"]["node_applications"]


def with_apps(config: dict, version: dict, nodes) -> dict:
    out = copy.deepcopy(config)
    out["applications"] = [version, *sorted(nodes, key=lambda n: n["name"])]
    return out


class Client:
    """Posts to the pipeline without pause; counts answers by status and graph label."""

    def __init__(self, url: str):
        self.url = url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.statuses: dict = {}
        self.failures: list = []
        self.last_graph = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            try:
                status, body, headers = post(self.url, BODY, timeout=30)
            except OSError as exc:
                status, body, headers = None, repr(exc), {}
            with self.lock:
                self.statuses[status] = self.statuses.get(status, 0) + 1
                if status != 200:
                    self.failures.append((status, body))
                else:
                    self.last_graph = headers.get("x-raypipe-graph")

    def wait_graph(self, label: str, timeout: float = 120.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with self.lock:
                if self.last_graph == label:
                    return time.monotonic()
            time.sleep(0.02)
        raise AssertionError(f"the pipeline did not answer as {label} (last: {self.last_graph})")


@pytest.fixture(scope="module")
def serve():
    head = RayHead(python_path=[REPO_ROOT, RUNTIME_DIR, TESTS_DIR])
    try:
        head.wait_started()
        yield ServeRest(head)
    finally:
        head.stop()


def test_only_what_changed_restarts_and_no_request_fails(serve):
    v1 = serve.on_loopback(rendered("ensemble.shared"))
    v2 = serve.on_loopback(rendered("ensemble-v2.shared"))
    version1, nodes1 = split(v1)
    version2, nodes2 = split(v2)
    assert version1["name"] == version2["name"] == "ensemble"
    changed = {n for n in node_map(version1) if node_map(version1)[n] != node_map(version2)[n]}
    assert changed == {"model_b"}, changed

    serve.put(v1)
    serve.wait_apps([version1["name"], *nodes1])
    client = Client(serve.head.serve_url + version1["route_prefix"])
    client.thread.start()
    try:
        client.wait_graph("ensemble@1")
        before = serve.replicas()

        # (a) Wiring only: the version label and model_a's timeout, in the executor's user_config.
        wired = copy.deepcopy(version1)
        graph = wired["deployments"][0]["user_config"]["raypipe"]["graph"]
        graph["version"] = "1w"
        next(n for n in graph["nodes"] if n["name"] == "model_a")["timeout_ms"] = 4000
        put_at = serve.put(with_apps(v1, wired, nodes1.values()))
        in_place_s = client.wait_graph("ensemble@1w") - put_at
        serve.wait_apps([wired["name"], *nodes1])
        assert serve.replicas() == before, "a wiring-only change started replicas"

        # (b) One changed node, in the operator's order: add it, switch the executor, retire.
        old_b, new_b = node_map(version1)["model_b"], node_map(version2)["model_b"]
        put_at = serve.put(with_apps(v1, wired, [*nodes1.values(), nodes2[new_b]]))
        serve.wait_apps([new_b])
        started_s = time.monotonic() - put_at
        switch_at = serve.put(with_apps(v2, version2, [*nodes2.values(), nodes1[old_b]]))
        switched_s = client.wait_graph("ensemble@2") - switch_at
        serve.wait_apps([version2["name"]])
        time.sleep(1.0)  # requests that started on the old wiring finish (the operator waits the deadline)
        serve.put(v2)
        serve.wait_apps([old_b], present=False)
        after = serve.replicas()
        for app, deployments in before.items():
            if app == old_b:
                continue
            assert after.get(app) == deployments, f"{app} restarted: {deployments} -> {after.get(app)}"
        assert set(after) == {version2["name"], *nodes2}, after
        assert after[new_b]["model_b"], after
    finally:
        client.stop.set()
        client.thread.join(timeout=60)
    total = sum(client.statuses.values())
    assert not client.failures, f"{len(client.failures)} of {total} requests failed: {client.failures[:3]}"
    assert total > 20, client.statuses
    print(
        f"wiring in place: {in_place_s:.2f}s; changed node started: {started_s:.2f}s; "
        f"executor switched: {switched_s:.2f}s; {total} requests, none failed"
    )
