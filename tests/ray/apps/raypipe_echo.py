"""A tiny Ray Serve application for raypipe's dashboard-client tests.

Needs nothing beyond `ray[serve]`. The test Ray head has this directory on its PYTHONPATH, so
Serve configs import it as `raypipe_echo:app` or through the builder `raypipe_echo:build`.
"""

import time

from ray import serve
from starlette.requests import Request


@serve.deployment(ray_actor_options={"num_cpus": 0.05})
class Echo:
    def __init__(self, greeting: str = "hello", startup_delay_s: float = 0.0):
        # A slow constructor keeps the application DEPLOYING long enough for a test to see it.
        time.sleep(startup_delay_s)
        self.greeting = greeting

    def reconfigure(self, user_config: dict) -> None:
        # `user_config` changes are applied in place, without new replicas.
        self.greeting = user_config.get("greeting", self.greeting)

    async def __call__(self, request: Request) -> dict:
        body = await request.body()
        return {"greeting": self.greeting, "path": request.url.path, "body": body.decode()}


app = Echo.bind()


def build(args: dict):
    """Application builder: `args` may set `greeting` and `startup_delay_s`."""
    return Echo.bind(
        greeting=str(args.get("greeting", "hello")),
        startup_delay_s=float(args.get("startup_delay_s", 0.0)),
    )
