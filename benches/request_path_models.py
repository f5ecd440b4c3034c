"""Models and hand-written Serve applications for benches/request_path.py (on the bench head's
PYTHONPATH): no-op models, the same three graphs written by hand with DeploymentHandles, and the
in-process limit (the three models called directly inside one deployment).

Every deployment here takes up to 100 requests at once (as raypipe's executor does), so no
variant is limited by Serve's default of 5."""

from ray import serve

ONGOING = 100


class Echo:
    """A no-op model: answers its input."""

    async def __call__(self, doc):
        return doc


def _choose_a(doc) -> bool:
    return isinstance(doc, dict) and doc.get("tier") == "gold"


# ---- hand-written Serve: one deployment per model, an ingress calling them by handle ---------

@serve.deployment(max_ongoing_requests=ONGOING)
class EchoDeployment(Echo):
    pass


@serve.deployment(max_ongoing_requests=ONGOING)
class HandChain:
    def __init__(self, a, b, c):
        self.a, self.b, self.c = a, b, c

    async def __call__(self, request):
        doc = await request.json()
        return await self.c.remote(await self.b.remote(await self.a.remote(doc)))


@serve.deployment(max_ongoing_requests=ONGOING)
class HandFanout:
    def __init__(self, a, b, c):
        self.a, self.b, self.c = a, b, c

    async def __call__(self, request):
        doc = await request.json()
        ra, rb = self.a.remote(doc), self.b.remote(doc)
        return await self.c.remote({"a": await ra, "b": await rb})


@serve.deployment(max_ongoing_requests=ONGOING)
class HandSwitch:
    def __init__(self, a, b, c):
        self.a, self.b, self.c = a, b, c

    async def __call__(self, request):
        doc = await request.json()
        chosen = self.a if _choose_a(doc) else self.b
        return await self.c.remote(await chosen.remote(doc))


def _three():
    return [EchoDeployment.options(name=name).bind() for name in ("a", "b", "c")]


def hand_chain(args=None):
    return HandChain.bind(*_three())


def hand_fanout(args=None):
    return HandFanout.bind(*_three())


def hand_switch(args=None):
    return HandSwitch.bind(*_three())


# ---- the in-process limit: the three models inside the one deployment that takes HTTP --------

class _Limit:
    def __init__(self):
        self.a, self.b, self.c = Echo(), Echo(), Echo()


@serve.deployment(max_ongoing_requests=ONGOING)
class LimitChain(_Limit):
    async def __call__(self, request):
        doc = await request.json()
        return await self.c(await self.b(await self.a(doc)))


@serve.deployment(max_ongoing_requests=ONGOING)
class LimitFanout(_Limit):
    async def __call__(self, request):
        doc = await request.json()
        return await self.c({"a": await self.a(doc), "b": await self.b(doc)})


@serve.deployment(max_ongoing_requests=ONGOING)
class LimitSwitch(_Limit):
    async def __call__(self, request):
        doc = await request.json()
        chosen = self.a if _choose_a(doc) else self.b
        return await self.c(await chosen(doc))


def limit_chain(args=None):
    return LimitChain.bind()


def limit_fanout(args=None):
    return LimitFanout.bind()


def limit_switch(args=None):
    return LimitSwitch.bind()
