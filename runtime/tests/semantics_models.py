"""Test-only applications for test_serve_semantics_ray.py: a `Front` deployment that calls a
`Back` deployment, each reporting the replica it runs in, so a test can tell which replicas a
Serve config change started."""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request


def _replica_id() -> str:
    return serve.get_replica_context().replica_id.unique_id


@serve.deployment
class Back:
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self) -> dict:
        return {"tag": self.tag, "replica": _replica_id()}


@serve.deployment
class Front:
    def __init__(self, back: DeploymentHandle, tag: str) -> None:
        self.back = back
        self.tag = tag
        self.config: dict[str, Any] = {}

    def reconfigure(self, config: dict) -> None:
        self.config = dict(config)

    async def __call__(self, request: Request) -> dict:
        back = await self.back.remote()
        return {"tag": self.tag, "config": self.config, "replica": _replica_id(), "back": back}


@serve.deployment
class Caller:
    """Calls another application's deployment by name, as a node shared across graph versions
    would be called."""

    def __init__(self, app: str, deployment: str) -> None:
        self.app, self.deployment = app, deployment

    async def __call__(self, request: Request) -> dict:
        handle = serve.get_deployment_handle(self.deployment, app_name=self.app)
        return {"called": await handle.remote(), "replica": _replica_id()}


@serve.deployment
class Env:
    """Reports the runtime_env its replica runs in."""

    def __call__(self, request: Request) -> dict:
        import ray

        env = ray.get_runtime_context().runtime_env
        return {"env_vars": env.get("env_vars") or {}, "config": env.get("config") or {}}


def env(args: dict):
    """Application builder: Env alone."""
    return Env.bind()


def front(args: dict):
    """Application builder: Front (`args["tag"]`) → Back (`args["back_tag"]`)."""
    return Front.bind(Back.bind(args["back_tag"]), args["tag"])


def back(args: dict):
    """Application builder: Back alone, no route of its own."""
    return Back.bind(args["tag"])


def caller(args: dict):
    """Application builder: a Caller of `args["app"]`'s `args["deployment"]`."""
    return Caller.bind(args["app"], args["deployment"])
