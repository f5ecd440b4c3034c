"""raypipe's own stand-in for the `fruit` module of KubeRay's sample RayServices.

The samples import `fruit.deployment_graph` from a `working_dir` zip and configure four
deployments by name: three stands whose `user_config` carries a `price`, and a market that
routes a JSON request `[fruit, amount]` to the stand of that fruit and answers with
`price * amount`. raypipe's tests serve this directory as that zip from 127.0.0.1.
"""

from ray import serve
from starlette.requests import Request


class _Stand:
    """Prices one fruit; the price comes from the deployment's `user_config`."""

    def __init__(self):
        self._price = 0.0

    def reconfigure(self, config):
        self._price = float((config or {}).get("price", 0))

    def total(self, amount):
        return self._price * amount


@serve.deployment
class MangoStand(_Stand):
    pass


@serve.deployment
class OrangeStand(_Stand):
    pass


@serve.deployment
class PearStand(_Stand):
    pass


@serve.deployment
class FruitMarket:
    """HTTP ingress: `["PEAR", 12]` → the pear stand's price times 12."""

    def __init__(self, mango, orange, pear):
        self._stands = {"MANGO": mango, "ORANGE": orange, "PEAR": pear}

    async def __call__(self, request: Request):
        fruit, amount = await request.json()
        stand = self._stands.get(str(fruit).upper())
        if stand is None:
            return {"error": f"no stand sells {fruit!r}"}
        total = await stand.total.remote(float(amount))
        return int(total) if float(total).is_integer() else total


deployment_graph = FruitMarket.bind(MangoStand.bind(), OrangeStand.bind(), PearStand.bind())
