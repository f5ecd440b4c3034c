"""Timers for the engine that work on every Python Ray runs on (3.10 has no asyncio.timeout).

Callers look `timeout_at` up on this module when they use it (`timeouts.timeout_at(...)`), so a
test can swap in the Python 3.10 stand-in."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any


class TimeoutAt:
    """`asyncio.timeout_at` for Python 3.10 (Ray 2.60 still runs on it): cancels the running task
    at `when` (loop time) and turns that cancellation into TimeoutError on the way out."""

    def __init__(self, when: float):
        self._when = when
        self._expired = False
        self._handle: asyncio.TimerHandle | None = None

    def expired(self) -> bool:
        return self._expired

    async def __aenter__(self) -> TimeoutAt:
        task = asyncio.current_task()
        assert task is not None  # entered from a coroutine, which runs in a task
        self._handle = asyncio.get_running_loop().call_at(self._when, self._expire, task)
        return self

    def _expire(self, task: asyncio.Task) -> None:
        self._expired = True
        task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._expired and exc_type is asyncio.CancelledError:
            raise asyncio.TimeoutError from exc
        return None


# asyncio's own where the running Python has it (3.11+).
timeout_at: Any = getattr(asyncio, "timeout_at", TimeoutAt)


def cancel_requested() -> bool:
    """Whether the running task is being cancelled (by a timeout, the request's end or its
    client), as opposed to a callee raising CancelledError of its own. Python 3.10 cannot tell
    the two apart: there a CancelledError always counts as a cancellation of the request."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling() > 0 if cancelling is not None else True
