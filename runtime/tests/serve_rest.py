"""The Serve REST API of a test Ray head, as raypipe's RayService controller uses it: PUT a
whole config, read the applications back, and see which replicas each deployment runs, so a
test can tell which replicas a config change started."""

from __future__ import annotations

import copy
import time

from loopback_http import request
from rayhead import LOOPBACK, RayHead


class ServeRest:
    def __init__(self, head: RayHead):
        self.head = head
        self.dashboard = f"http://{LOOPBACK}:{head.ports['dashboard']}"

    def on_loopback(self, config: dict) -> dict:
        """A rendered config with the head's loopback Serve port (and one HTTP proxy)."""
        config = copy.deepcopy(config)
        config["proxy_location"] = "HeadOnly"
        config["http_options"] = {
            **(config.get("http_options") or {}),
            "host": LOOPBACK,
            "port": self.head.ports["serve_http"],
        }
        return config

    def put(self, config: dict) -> float:
        """PUTs the config; returns when (monotonic) it was accepted."""
        status, body, _ = request("PUT", f"{self.dashboard}/api/serve/applications/", config, timeout=60)
        assert status == 200, body
        return time.monotonic()

    def applications(self) -> dict:
        _, body, _ = request("GET", f"{self.dashboard}/api/serve/applications/", timeout=10)
        return (body or {}).get("applications") or {}

    def replicas(self) -> dict:
        """{application: {deployment: sorted replica ids}} of the running replicas."""
        return {
            app: {
                name: sorted(r["replica_id"] for r in d.get("replicas") or [] if r.get("state") == "RUNNING")
                for name, d in (details.get("deployments") or {}).items()
            }
            for app, details in self.applications().items()
        }

    def wait_apps(self, names, present: bool = True, timeout: float = 240.0) -> None:
        """Until every named application is RUNNING (`present`) or gone."""
        deadline = time.monotonic() + timeout
        apps: dict = {}
        while time.monotonic() < deadline:
            apps = self.applications()
            if all(((apps.get(n) or {}).get("status") == "RUNNING") if present else (n not in apps) for n in names):
                return
            time.sleep(0.2)
        state = {n: (apps.get(n) or {}).get("status") for n in names}
        raise AssertionError(f"applications not {'running' if present else 'gone'}: {state}")
