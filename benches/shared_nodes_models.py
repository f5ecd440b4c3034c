"""Models for benches/shared_nodes.py: a node whose start takes a measurable time, as loading
weights does, and that hands its input on with its tag added."""

from __future__ import annotations

import time


class SlowStart:
    def __init__(self, load_s: float, tag: str) -> None:
        time.sleep(load_s)  # stands for loading weights
        self.tag = tag

    async def __call__(self, request: dict) -> dict:
        seen = list((request or {}).get("seen") or [])
        return {"seen": [*seen, self.tag]}
