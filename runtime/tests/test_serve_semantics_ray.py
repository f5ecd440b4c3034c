"""What Ray Serve restarts when a Serve config changes, on a real Ray (127.0.0.1 only), PUT to
the dashboard as raypipe's RayService controller does. These are the facts issue 32's shared
model nodes are designed on (docs/design/shared-nodes.md); if a Ray upgrade changes one, this
fails before the design silently stops holding:

- a changed `user_config` reaches the running replica (`reconfigure`), nothing restarts;
- a changed `args` restarts every deployment of that application, also one whose own
  init arguments did not change: Serve versions an application's code by its args as a whole;
- other applications in the same config keep their replicas, also while an application is
  added beside them and removed again;
- a deployment calls another application's deployment by name (`get_deployment_handle`);
- a deployment's own `runtime_env` replaces its application's key by key (only `env_vars`
  are combined), so raypipe must add the application's `py_modules` to a node's own
  (src/serve/render.rs, `keep_application_modules`).

Skipped when Ray is not importable, unless RAYPIPE_REQUIRE_RAY=1 (then it fails).
"""

import os
import time

import pytest
from conftest import REPO_ROOT, RUNTIME_DIR
from loopback_http import request
from rayhead import LOOPBACK, RayHead

if os.environ.get("RAYPIPE_REQUIRE_RAY") != "1":
    pytest.importorskip("ray", reason="ray[serve] is not installed in this interpreter")

TESTS_DIR = RUNTIME_DIR / "tests"


def config(head: RayHead, front_tag: str, front_config: dict, extra: bool = False) -> dict:
    """Three applications: `nodes` (a Back with no route), `a` (Front → Back on /a, Back's own
    argument fixed) and `c` (on /c, calling `nodes`' Back by name); `extra` adds a fourth, as a
    canary adds the nodes that changed."""
    extra_apps = [
        {"name": "nodes-2", "route_prefix": None, "import_path": "semantics_models:back", "args": {"tag": "new"}}
    ]
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": LOOPBACK, "port": head.ports["serve_http"]},
        "applications": [
            {
                "name": "nodes",
                "route_prefix": None,
                "import_path": "semantics_models:back",
                "args": {"tag": "shared"},
            },
            {
                "name": "a",
                "route_prefix": "/a",
                "import_path": "semantics_models:front",
                "args": {"tag": front_tag, "back_tag": "unchanged"},
                "deployments": [{"name": "Front", "user_config": front_config}],
            },
            {
                "name": "c",
                "route_prefix": "/c",
                "import_path": "semantics_models:caller",
                "args": {"app": "nodes", "deployment": "Back"},
            },
            {
                "name": "env",
                "route_prefix": "/env",
                "import_path": "semantics_models:env",
                "args": {},
                "runtime_env": {"env_vars": {"FROM_APP": "1"}, "config": {"setup_timeout_seconds": 601}},
                "deployments": [
                    {
                        "name": "Env",
                        "ray_actor_options": {
                            "runtime_env": {"env_vars": {"FROM_NODE": "1"}, "config": {"eager_install": False}}
                        },
                    }
                ],
            },
        ]
        + (extra_apps if extra else []),
    }


class Deployed:
    def __init__(self, head: RayHead):
        self.head = head
        self.dashboard = f"http://{LOOPBACK}:{head.ports['dashboard']}"

    def put(self, front_tag: str, front_config: dict, extra: bool = False) -> float:
        """PUTs the config; returns when (monotonic) it was accepted."""
        body = config(self.head, front_tag, front_config, extra)
        status, body, _ = request("PUT", f"{self.dashboard}/api/serve/applications/", body, timeout=60)
        assert status == 200, body
        return time.monotonic()

    def get(self, route: str):
        status, body, _ = request("GET", self.head.serve_url + route, timeout=10)
        return body if status == 200 else None

    def answer(self, route: str, ready, what: str, timeout: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.get(route)
            except OSError as exc:
                last = exc
            if isinstance(last, dict) and ready(last):
                return last
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what} on {route} (last: {last!r})")

    def wait_app(self, name: str, present: bool, timeout: float = 120.0) -> None:
        """Until the application is RUNNING (`present`) or gone."""
        deadline = time.monotonic() + timeout
        apps = {}
        while time.monotonic() < deadline:
            _, body, _ = request("GET", f"{self.dashboard}/api/serve/applications/", timeout=10)
            apps = (body or {}).get("applications") or {}
            status = (apps.get(name) or {}).get("status")
            if (status == "RUNNING") if present else (name not in apps):
                return
            time.sleep(0.2)
        raise AssertionError(f"application {name} {'not running' if present else 'still there'}: {apps.get(name)}")


@pytest.fixture(scope="module")
def deployed():
    head = RayHead(python_path=[REPO_ROOT, RUNTIME_DIR, TESTS_DIR])
    try:
        head.wait_started()
        yield Deployed(head)
    finally:
        head.stop()


def test_a_deployments_runtime_env_replaces_its_applications_key_by_key(deployed):
    deployed.put("v1", {"weight": 1})
    env = deployed.answer("/env", lambda b: "env_vars" in b, "application env")
    # env_vars are combined; any other key (here `config`, as `py_modules` would) is replaced.
    assert env["env_vars"].get("FROM_APP") == "1" and env["env_vars"].get("FROM_NODE") == "1", env
    # The application's `config` (setup_timeout_seconds 601) is gone; Ray fills in its default.
    assert env["config"].get("setup_timeout_seconds") != 601, env
    assert env["config"].get("eager_install") is False, env


def test_what_a_serve_config_change_restarts(deployed):
    deployed.put("v1", {"weight": 1})
    first = deployed.answer("/a", lambda b: b["tag"] == "v1", "application a")
    shared = deployed.answer("/c", lambda b: "called" in b, "application c")["called"]
    # A deployment reaches another application's deployment by name.
    assert shared["tag"] == "shared", shared

    # user_config only: the running Front is reconfigured; no replica of any application starts.
    put_at = deployed.put("v1", {"weight": 2})
    second = deployed.answer("/a", lambda b: b["config"] == {"weight": 2}, "the new user_config")
    in_place_s = time.monotonic() - put_at
    assert second["replica"] == first["replica"], (first, second)
    assert second["back"]["replica"] == first["back"]["replica"], (first, second)

    # args changed for Front alone: Back, whose init arguments are the same, restarts too.
    put_at = deployed.put("v2", {"weight": 2})
    third = deployed.answer("/a", lambda b: b["tag"] == "v2", "application a with the new args")
    restart_s = time.monotonic() - put_at
    assert third["replica"] != first["replica"], (first, third)
    assert third["back"]["replica"] != first["back"]["replica"], (first, third)
    assert third["back"]["tag"] == "unchanged", third

    # An application added beside them and removed again: nothing else restarts.
    deployed.put("v2", {"weight": 2}, extra=True)
    deployed.wait_app("nodes-2", present=True)
    deployed.put("v2", {"weight": 2})
    deployed.wait_app("nodes-2", present=False)
    fourth = deployed.answer("/a", lambda b: b["tag"] == "v2", "application a")
    assert (fourth["replica"], fourth["back"]["replica"]) == (third["replica"], third["back"]["replica"])

    # The other applications kept their replicas through every change.
    after = deployed.answer("/c", lambda b: "called" in b, "application c")["called"]
    assert after["replica"] == shared["replica"], (shared, after)
    print(f"user_config in place: {in_place_s:.2f}s; args change, application restarted: {restart_s:.2f}s")
