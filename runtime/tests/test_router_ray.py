"""The rollout router on a real Ray (the pinned ray[serve] of raypipe's test venv), 127.0.0.1 only,
deployed the way the operator deploys it: one Serve config PUT to the dashboard with a stable
version application (the rendered `sequence` graph, no route), a canary version whose classifier
fails on every request (tests/rollout_models.py), and the router application on the pipeline's
route. Each step changes only the router's user_config (a live reconfigure) and checks what
clients saw against the router's own rollout snapshot.

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

# This driver only speaks HTTP (the dashboard's Serve API, the route): Ray itself is needed by
# the head, which RayHead starts from this interpreter's venv.
if os.environ.get("RAYPIPE_REQUIRE_RAY") != "1":
    pytest.importorskip("ray", reason="ray[serve] is not installed in this interpreter")

TESTS_DIR = RUNTIME_DIR / "tests"
PIPELINE = "pipe"
STABLE_APP, CANARY_APP = "pipe--aaaaaaaaaaaa", "pipe--bbbbbbbbbbbb"
ROUTE = "/pipe"
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
    return {"generation": generation, "retry_on_stable": retry,
            "stable": {"app": stable_app, "deployment": "raypipe-executor", "version": "v1"},
            "canary": {"app": CANARY_APP, "deployment": "raypipe-executor", "version": "v2",
                       "weight": weight}}


def serve_config(head: RayHead, user_config: dict) -> dict:
    small = {"ray_actor_options": {"num_cpus": 0.1}}
    router = {"name": PIPELINE, "route_prefix": ROUTE, "import_path": "raypipe_runtime.router:build",
              "args": {"api_version": "raypipe.router.v1"},
              "deployments": [{"name": "raypipe-router", "user_config": user_config, **small},
                              {"name": "raypipe-rollout-stats", **small}]}
    return {"proxy_location": "HeadOnly",
            "http_options": {"host": LOOPBACK, "port": head.ports["serve_http"]},
            "applications": [version_app(STABLE_APP, failing=False),
                             version_app(CANARY_APP, failing=True), router]}


class Rollout:
    """The deployed pipeline: reconfigure the router, send requests, read the snapshot."""

    def __init__(self, head: RayHead):
        self.head = head
        self.dashboard = f"http://{LOOPBACK}:{head.ports['dashboard']}"
        self.url = head.serve_url + ROUTE

    def apply(self, user_config: dict) -> None:
        """PUTs the whole Serve config (as the operator does) and waits until the router
        routes under the new generation."""
        status, body, _ = request("PUT", f"{self.dashboard}/api/serve/applications/",
                                  serve_config(self.head, user_config))
        assert status == 200, body
        self.wait_for(lambda: self.snapshot()["generation"] == user_config["generation"],
                      f"the router taking generation {user_config['generation']}")

    def snapshot(self, generation=None) -> dict:
        query = f"?generation={generation}" if generation else ""
        status, body, _ = request("GET", f"{self.url}/-/raypipe/rollout{query}")
        assert status == 200, (status, body)
        return body

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
        return {name: (app.get("status"), app.get("message", "")[:500])
                for name, app in ((body or {}).get("applications") or {}).items()}


@pytest.fixture(scope="module")
def rollout():
    head = RayHead(python_path=[REPO_ROOT, RUNTIME_DIR, TESTS_DIR])
    try:
        head.wait_started()
        deployed = Rollout(head)
        deployed.wait_for(lambda: request("GET", f"{deployed.dashboard}/api/version")[0] == 200,
                          "the dashboard")
        deployed.apply(router_config("g0", weight=0, retry=True))
        deployed.wait_for(lambda: {s for s, _ in deployed.apps().values()} == {"RUNNING"},
                          "every application RUNNING")
        yield deployed
    finally:
        head.stop()


def only_router(snapshot: dict) -> str:
    (replica,) = snapshot["routers"]
    return replica


def test_weight_0_sends_everything_to_stable(rollout):
    seen, answers = rollout.send()
    assert seen == {"stable": SENT}, seen
    assert all(status == 200 and headers["x-raypipe-version"] == "v1" for status, _, headers in answers)
    snap = rollout.snapshot()
    assert (snap["stable"]["requests"], snap["stable"]["errors"], snap["canary"]["requests"]) == (SENT, 0, 0)
    assert sum(snap["stable"]["buckets"]) == SENT and snap["stable"]["sum_ms"] > 0
    assert snap["routers"][only_router(snap)]["generation"] == "g0"


def test_weight_50_reaches_both_versions_and_the_snapshot_counts_them(rollout):
    before = only_router(rollout.snapshot())
    rollout.apply(router_config("g1", weight=50, retry=False))
    seen, answers = rollout.send()
    assert seen["stable"] > 0 and seen["canary"] > 0 and seen["stable"] + seen["canary"] == SENT, seen
    for status, body, headers in answers:
        if headers["x-raypipe-rollout"] == "stable":
            assert (status, headers["x-raypipe-version"]) == (200, "v1"), body
        else:  # the canary's own answer: its failing classifier, named by its executor
            assert (status, headers["x-raypipe-version"], body["error"]["node"]) == (502, "v2", "classify"), body
    snap = rollout.snapshot()
    assert snap["generation"] == "g1"
    assert (snap["stable"]["requests"], snap["stable"]["errors"]) == (seen["stable"], 0)
    assert snap["canary"]["requests"] == snap["canary"]["errors"] == seen["canary"]
    assert snap["canary"]["retried"] == 0
    assert sum(snap["canary"]["buckets"]) == seen["canary"]
    # The new weight came by reconfigure: the same router replica, now on g1; g0 keeps its counts.
    assert only_router(snap) == before and snap["routers"][before]["generation"] == "g1"
    assert rollout.snapshot("g0")["stable"]["requests"] == SENT


def test_a_failing_canary_is_retried_on_stable_so_no_client_sees_it(rollout):
    before = only_router(rollout.snapshot())
    rollout.apply(router_config("g2", weight=50, retry=True))
    seen, answers = rollout.send()
    assert all(status == 200 for status, _, _ in answers), [a for a in answers if a[0] != 200][:2]
    assert seen["retried"] > 0 and seen["stable"] + seen["retried"] == SENT, seen
    assert all(headers["x-raypipe-version"] == "v1" for _, _, headers in answers)
    snap = rollout.snapshot()
    assert snap["canary"]["requests"] == snap["canary"]["errors"] == snap["canary"]["retried"] == seen["retried"]
    # Stable served every client request: its own picks and the retries.
    assert (snap["stable"]["requests"], snap["stable"]["errors"]) == (SENT, 0)
    assert only_router(snap) == before and snap["routers"][before]["generation"] == "g2"


def test_a_missing_stable_application_is_503_unavailable(rollout):
    rollout.apply({**router_config("g3", weight=0, retry=True, stable_app="pipe--cccccccccccc")})
    status, body, headers = post(rollout.url, DOCUMENT, timeout=20)
    assert status == 503, body
    assert body["error"]["code"] == "UNAVAILABLE" and "pipe--cccccccccccc" in body["error"]["message"]
    assert headers["x-raypipe-rollout"] == "stable"


def test_a_malformed_config_is_refused_and_the_router_keeps_routing(rollout):
    rollout.apply(router_config("g4", weight=0, retry=True))
    before = only_router(rollout.snapshot())
    bad = router_config("g5", weight=250, retry=True)
    status, body, _ = request("PUT", f"{rollout.dashboard}/api/serve/applications/",
                              serve_config(rollout.head, bad))
    assert status == 200, body
    rollout.wait_for(lambda: "config_error" in rollout.snapshot()["routers"][before],
                     "the router reporting the refused config")
    snap = rollout.snapshot()
    assert snap["generation"] == "g4" and snap["routers"][before]["generation"] == "g4"
    assert "user_config.canary.weight" in snap["routers"][before]["config_error"]
    # Serve itself sees a reconfigure that returned: nothing is wrong from its side.
    rollout.wait_for(lambda: rollout.apps()[PIPELINE][0] == "RUNNING", "the router app RUNNING")
    seen, answers = rollout.send(10)
    assert seen == {"stable": 10} and all(status == 200 for status, _, _ in answers), seen
    # The next good config is taken by the same replica and clears the refusal.
    rollout.apply(router_config("g6", weight=0, retry=True))
    snap = rollout.snapshot()
    assert only_router(snap) == before and "config_error" not in snap["routers"][before]
