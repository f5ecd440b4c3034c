"""A gated model for test_ray_serve.py's backpressure test: samples.models.Preprocess that
answers only once the test opens a gate (a named Ray actor). While the gate is shut no call
can finish, so every answer the test sees then was given without waiting in a queue.
Importable by Serve replicas: the test's Ray head has this directory on its PYTHONPATH."""

import asyncio

import ray
from samples.models import Preprocess

GATE_NAME = "raypipe-test-gate"
GATE_NAMESPACE = "raypipe-test"


@ray.remote(num_cpus=0)
class Gate:
    def __init__(self):
        self._open = asyncio.Event()

    async def wait(self) -> None:
        await self._open.wait()

    async def open(self) -> None:
        self._open.set()


def new_gate(timeout: float = 30.0):
    """A shut gate under the one name GatedPreprocess looks up. A previous test's gate dies when
    its handle is dropped, but Ray frees the name a moment later: wait for it."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            return Gate.options(name=GATE_NAME, namespace=GATE_NAMESPACE).remote()
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class GatedPreprocess(Preprocess):
    async def __call__(self, payload) -> dict:
        gate = ray.get_actor(GATE_NAME, namespace=GATE_NAMESPACE)
        await gate.wait.remote()
        return super().__call__(payload)
