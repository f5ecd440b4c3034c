"""Models the fused-node tests run in-process inside the executor (test_fused.py): each
instance registers itself under its `key`, so a test can see how often it was constructed and
called and on which thread."""

import asyncio
import threading
import time

INSTANCES = {}


class _Registered:
    def __init__(self, key: str):
        self.key = key
        self.calls = 0
        self.threads = []
        INSTANCES.setdefault(key, []).append(self)

    def _called(self):
        self.calls += 1
        self.threads.append(threading.current_thread().name)


class AsyncAdd(_Registered):
    """Adds `amount` to the input number, as a coroutine; sleeps `delay_s` first."""

    def __init__(self, key: str, amount: int = 1, delay_s: float = 0.0):
        super().__init__(key)
        self.amount = amount
        self.delay_s = delay_s

    async def __call__(self, value):
        self._called()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return value + self.amount


class SyncDouble(_Registered):
    """Doubles the input number in a plain method (`predict`); blocks `delay_s` first."""

    def __init__(self, key: str, delay_s: float = 0.0):
        super().__init__(key)
        self.delay_s = delay_s

    def predict(self, value):
        self._called()
        if self.delay_s:
            time.sleep(self.delay_s)
        return value * 2


class Flaky(_Registered):
    """Fails its first `failures` calls (ValueError), then echoes its input."""

    def __init__(self, key: str, failures: int = 1):
        super().__init__(key)
        self.failures = failures

    async def __call__(self, value):
        self._called()
        if self.calls <= self.failures:
            raise ValueError(f"flaky call {self.calls}")
        return value


class Rejects(Exception):
    status_code = 409


class Raises(_Registered):
    """Raises on every call: a 409 (`status_code`) when `conflict`, else a RuntimeError."""

    def __init__(self, key: str, conflict: bool = False):
        super().__init__(key)
        self.conflict = conflict

    def __call__(self, value):
        self._called()
        if self.conflict:
            raise Rejects("already there")
        raise RuntimeError("model exploded")


class BrokenAtStart:
    def __init__(self):
        raise RuntimeError("weights are missing")


async def plain_function(value):
    return {"function saw": value}
