"""The rollout router on a real Ray (the pinned ray[serve] of raypipe's test venv), 127.0.0.1 only,
deployed the way the operator deploys it: one Serve config PUT to the dashboard with a stable
version application (the rendered `sequence` graph, no route), a canary version whose classifier
fails on every request (tests/rollout_models.py), and the router application on the pipeline's
route, with two router replicas (so the snapshot sums one replica's flushed counters and the
other's background reports). Each step changes only the router's user_config (a live
reconfigure) and checks what clients saw against the rollout snapshot.

Skipped when Ray is not importable, unless RAYPIPE_REQUIRE_RAY=1 (then it fails).
"""

import copy
import os
import time
from collections import Counter

import pytest
from conftest import REPO_ROOT, RUNTIME_DIR, rendered
from loopback_http import post, request
from rayhead import LOOPBACK, RayHead

from raypipe_runtime.router import WARMUP_CALLS

# This driver only speaks HTTP (the dashboard's Serve API, the route): Ray itself is needed by
# the head, which RayHead starts from this interpreter's venv.
if os.environ.get("RAYPIPE_REQUIRE_RAY") != "1":
    pytest.importorskip("ray", reason="ray[serve] is not installed in this interpreter")

TESTS_DIR = RUNTIME_DIR / "tests"
PIPELINE = "pipe"
STABLE_APP, CANARY_APP = "pipe--aaaaaaaaaaaa", "pipe--bbbbbbbbbbbb"
ROUTE = "/pipe"
ROUTER_REPLICAS = 2
SENT = 40  # per step; at weight 50 a version gets none with probability 2 * 0.5**40
DOCUMENT = {"text": "I love this great product"}


def version_app(name: str, failing: bool) -> dict:
    app = copy.deepcopy(rendered("sequence")["applications"][0])
    app.update(name=name, route_prefix=None)
    if failing:
        classify = next(n for n in app["args"]["graph"]["nodes"] if n["name"] == "classify")
        classify["model"]["import_path"] = "rollout_models:FailingClassifier"
    return app


def router_config(generation: str, weight: float, retry: bool, stable_app: str = STABLE_APP) -> dict:
    return {
        "generation": generation,
        "retry_on_stable": retry,
        "stable": {"app": stable_app, "deployment": "raypipe-executor", "version": "v1"},
        "canary": {"app": CANARY_APP, "deployment": "raypipe-executor", "version": "v2", "weight": weight},
    }


def serve_config(head: RayHead, user_config: dict) -> dict:
    # As src/serve/rollout.rs renders it (the router's CPU share is the code's default).
    router = {
        "name": PIPELINE,
        "route_prefix": ROUTE,
        "import_path": "raypipe_runtime.router:build",
        "args": {"api_version": "raypipe.router.v1"},
        "deployments": [
            {"name": "raypipe-router", "user_config": user_config, "num_replicas": ROUTER_REPLICAS},
            {"name": "raypipe-rollout-stats", "num_replicas": 1},
        ],
    }
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": LOOPBACK, "port": head.ports["serve_http"]},
        "applications": [version_app(STABLE_APP, failing=False), version_app(CANARY_APP, failing=True), router],
    }


class Rollout:
    """The deployed pipeline: reconfigure the router, send requests, read the snapshot."""

    def __init__(self, head: RayHead):
        self.head = head
        self.dashboard = f"http://{LOOPBACK}:{head.ports['dashboard']}"
        self.url = head.serve_url + ROUTE

    def apply(self, user_config: dict) -> None:
        """PUTs the whole Serve config (as the operator does) and waits, as the operator does
        before it deletes a version, until every router reports the new generation."""
        self.put(user_config)
        generation = user_config["generation"]
        self.wait_for(lambda: self.router_generations() == {generation}, f"every router on {generation}")

    def put(self, user_config: dict) -> None:
        status, body, _ = request(
            "PUT", f"{self.dashboard}/api/serve/applications/", serve_config(self.head, user_config)
        )
        assert status == 200, body

    def snapshot(self, generation=None) -> dict:
        query = f"?generation={generation}" if generation else ""
        status, body, _ = request("GET", f"{self.url}/-/raypipe/rollout{query}")
        assert status == 200, (status, body)
        return body

    def router_generations(self) -> set:
        snap = self.snapshot()
        assert len(snap["routers"]) == ROUTER_REPLICAS, snap["routers"]
        return {entry["generation"] for entry in snap["routers"].values()} | {snap["generation"]}

    def counted(self, stable: int, canary: int) -> dict:
        """The snapshot once it counts this many version calls: the replica that answers the
        GET flushes its own counters, the other's arrive with its next report (0.5 s)."""
        found = {}

        def complete():
            found.update(self.snapshot())
            return (found["stable"]["requests"], found["canary"]["requests"]) == (stable, canary)

        self.wait_for(complete, f"the snapshot counting {stable} stable and {canary} canary calls", timeout=10)
        return found

    def send(self, count: int = SENT):
        """(how many answers per x-raypipe-rollout value, the answers)."""
        answers = [post(self.url, DOCUMENT, {"x-request-id": str(n)}) for n in range(count)]
        return Counter(headers.get("x-raypipe-rollout") for _, _, headers in answers), answers

    def wait_for(self, condition, what: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except (AssertionError, OSError, KeyError, TypeError) as exc:
                last = exc
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what} (last: {last!r})\n{self.apps()}")

    def apps(self):
        _, body, _ = request("GET", f"{self.dashboard}/api/serve/applications/?api_type=declarative")
        return {
            name: (app.get("status"), app.get("message", "")[:500])
            for name, app in ((body or {}).get("applications") or {}).items()
        }


@pytest.fixture(scope="module")
def rollout():
    head = RayHead(python_path=[REPO_ROOT, RUNTIME_DIR, TESTS_DIR])
    try:
        head.wait_started()
        deployed = Rollout(head)
        deployed.wait_for(lambda: request("GET", f"{deployed.dashboard}/api/version")[0] == 200, "the dashboard")
        deployed.apply(router_config("g0", weight=0, retry=True))
        deployed.wait_for(lambda: {s for s, _ in deployed.apps().values()} == {"RUNNING"}, "every application RUNNING")
        yield deployed
    finally:
        head.stop()


def routers(snapshot: dict) -> set:
    return set(snapshot["routers"])


def test_weight_0_sends_everything_to_stable(rollout):
    seen, answers = rollout.send()
    assert seen == {"stable": SENT}, seen
    assert all(status == 200 and headers["x-raypipe-version"] == "v1" for status, _, headers in answers)
    snap = rollout.counted(stable=SENT, canary=0)
    assert snap["stable"]["errors"] == 0
    # Each router replica's first WARMUP_CALLS calls to a version count, but not in its latency.
    warmup = ROUTER_REPLICAS * WARMUP_CALLS
    assert SENT - warmup <= sum(snap["stable"]["buckets"]) < SENT and snap["stable"]["sum_ms"] > 0
    assert len(routers(snap)) == ROUTER_REPLICAS


def test_weight_50_reaches_both_versions_and_the_snapshot_counts_them(rollout):
    before = routers(rollout.snapshot())
    rollout.apply(router_config("g1", weight=50, retry=False))
    seen, answers = rollout.send()
    assert seen["stable"] > 0 and seen["canary"] > 0 and seen["stable"] + seen["canary"] == SENT, seen
    for status, body, headers in answers:
        if headers["x-raypipe-rollout"] == "stable":
            assert (status, headers["x-raypipe-version"]) == (200, "v1"), body
        else:  # the canary's own answer: its failing classifier, named by its executor
            assert (status, headers["x-raypipe-version"], body["error"]["node"]) == (502, "v2", "classify"), body
    snap = rollout.counted(stable=seen["stable"], canary=seen["canary"])
    assert snap["generation"] == "g1" and snap["stable"]["errors"] == 0
    assert snap["canary"]["errors"] == seen["canary"] and snap["canary"]["retried"] == 0
    warmup = ROUTER_REPLICAS * WARMUP_CALLS
    assert max(0, seen["canary"] - warmup) <= sum(snap["canary"]["buckets"]) < seen["canary"]
    # The new weight came by reconfigure: the same router replicas, now on g1; g0 keeps its counts.
    assert routers(snap) == before
    assert rollout.snapshot("g0")["stable"]["requests"] == SENT


def test_a_failing_canary_is_retried_on_stable_so_no_client_sees_it(rollout):
    before = routers(rollout.snapshot())
    rollout.apply(router_config("g2", weight=50, retry=True))
    seen, answers = rollout.send()
    assert all(status == 200 for status, _, _ in answers), [a for a in answers if a[0] != 200][:2]
    assert seen["retried"] > 0 and seen["stable"] + seen["retried"] == SENT, seen
    assert all(headers["x-raypipe-version"] == "v1" for _, _, headers in answers)
    # Stable served every client request: its own picks and the retries.
    snap = rollout.counted(stable=SENT, canary=seen["retried"])
    assert snap["canary"]["errors"] == snap["canary"]["retried"] == seen["retried"]
    assert snap["stable"]["errors"] == 0
    assert routers(snap) == before


def test_a_missing_stable_application_is_503_unavailable(rollout):
    rollout.apply(router_config("g3", weight=0, retry=True, stable_app="pipe--cccccccccccc"))
    status, body, headers = post(rollout.url, DOCUMENT, timeout=20)
    assert status == 503, body
    assert body["error"]["code"] == "UNAVAILABLE" and "pipe--cccccccccccc" in body["error"]["message"]
    assert headers["x-raypipe-rollout"] == "stable"


def test_a_malformed_config_is_refused_and_the_router_keeps_routing(rollout):
    rollout.apply(router_config("g4", weight=0, retry=True))
    before = routers(rollout.snapshot())
    rollout.put(router_config("g5", weight=250, retry=True))

    def refused():
        entries = rollout.snapshot()["routers"].values()
        return all("user_config.canary.weight" in entry.get("config_error", "") for entry in entries)

    rollout.wait_for(refused, "every router reporting the refused config")
    assert rollout.router_generations() == {"g4"}
    # Serve itself sees a reconfigure that returned: nothing is wrong from its side.
    rollout.wait_for(lambda: rollout.apps()[PIPELINE][0] == "RUNNING", "the router app RUNNING")
    seen, answers = rollout.send(10)
    assert seen == {"stable": 10} and all(status == 200 for status, _, _ in answers), seen
    # The next good config is taken by the same replicas and clears the refusal.
    rollout.apply(router_config("g6", weight=0, retry=True))
    snap = rollout.snapshot()
    assert routers(snap) == before
    assert not any("config_error" in entry for entry in snap["routers"].values())
