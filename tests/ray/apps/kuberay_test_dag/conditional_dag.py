"""raypipe's own stand-in for the `conditional_dag` module of KubeRay's sample RayService.

`conditional_dag.serve_dag` is an ingress `Router` that takes a JSON request `[op, value]`
and sends `value` to `Adder` (op `ADD`, adds its `user_config` `increment`) or `Multiplier`
(op `MUL`, multiplies by its `user_config` `factor`).
"""

from ray import serve
from starlette.requests import Request


@serve.deployment
class Adder:
    def __init__(self):
        self._increment = 0

    def reconfigure(self, config):
        self._increment = (config or {}).get("increment", 0)

    def apply(self, value):
        return value + self._increment


@serve.deployment
class Multiplier:
    def __init__(self):
        self._factor = 1

    def reconfigure(self, config):
        self._factor = (config or {}).get("factor", 1)

    def apply(self, value):
        return value * self._factor


@serve.deployment
class Router:
    """HTTP ingress: `["ADD", 1]` → 1 + increment, `["MUL", 2]` → 2 * factor."""

    def __init__(self, adder, multiplier):
        self._operations = {"ADD": adder, "MUL": multiplier}

    async def __call__(self, request: Request):
        op, value = await request.json()
        target = self._operations.get(str(op).upper())
        if target is None:
            return {"error": f"unknown operation {op!r}"}
        return await target.apply.remote(value)


serve_dag = Router.bind(Adder.bind(), Multiplier.bind())
