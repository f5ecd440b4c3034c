"""Calling one model node for a request: its attempts (the node's own timeout, retries with
backoff for the listed failure classes, never past the deadline), the call's timing for the
trace and the observer, and what its on_error policy makes of a failure."""

from __future__ import annotations

import asyncio
import copy
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from . import timeouts
from .assembly import call_args
from .errors import (
    FAILURE_CODES,
    Backpressure,
    Failure,
    GraphError,
    Unavailable,
    describe_exception,
    http_status_of,
    retry_after_seconds,
)
from .observer import OUTCOME_OK, OUTCOME_SHADOW_FAILED, OUTCOME_SKIPPED, OUTCOME_TIMEOUT, failure_outcome
from .spec import NodeSpec
from .states import DONE, FAILED, SKIPPED

if TYPE_CHECKING:
    from .scheduler import Run

logger = logging.getLogger("raypipe_runtime")

Caller = Callable[..., Awaitable[Any]]


class NodeTimeout(Exception):
    """A node's own timeout ended an attempt."""


async def call_once(caller: Caller, args: tuple, kwargs: dict, timeout: float | None) -> Any:
    """One call, bounded by `timeout` seconds when given; awaited directly when not."""
    if timeout is None:
        return await caller(*args, **kwargs)
    scope = timeouts.timeout_at(asyncio.get_running_loop().time() + timeout)
    try:
        async with scope:
            return await caller(*args, **kwargs)
    except asyncio.TimeoutError:
        if scope.expired():
            raise NodeTimeout from None
        raise


async def attempts(
    node: NodeSpec,
    caller: Caller,
    args: tuple,
    kwargs: dict,
    *,
    remaining: Callable[[], float],
    rng: random.Random,
    sleep: Callable[[float], Awaitable[None]],
) -> tuple[str, Any, int]:
    """Calls the node until it answers or its retries end: ("ok", value, attempts),
    ("failed", Failure, attempts) or ("deadline", None, attempts). `remaining()` is the time
    left until the request deadline, which itself is enforced around the whole request (and
    around each shadow call)."""
    retry = node.retry
    own_timeout = node.timeout_ms / 1000.0 if node.timeout_ms else None
    attempt = 0
    while True:
        attempt += 1
        left = remaining()
        if left <= 0:
            return ("deadline", None, attempt - 1)
        try:
            # The node's own timer only when it ends first; otherwise the deadline's does.
            timeout = own_timeout if own_timeout is not None and own_timeout < left else None
            return ("ok", await call_once(caller, args, kwargs, timeout), attempt)
        except NodeTimeout:
            failure = Failure("TIMEOUT", f"attempt {attempt} timed out after {node.timeout_ms} ms", attempt)
        except asyncio.CancelledError:
            if timeouts.cancel_requested():
                raise
            failure = Failure("UNAVAILABLE", "the call was cancelled", attempt)
        except Unavailable as exc:
            failure = Failure("UNAVAILABLE", describe_exception(exc), attempt)
        except Backpressure as exc:
            failure = Failure(
                "BACKPRESSURE", describe_exception(exc), attempt, retry_after=retry_after_seconds(exc.retry_after_s)
            )
        except Exception as exc:
            failure = Failure("APP_ERROR", describe_exception(exc), attempt, status=http_status_of(exc))
        if attempt >= retry.attempts or failure.kind not in retry.retry_on:
            return ("failed", failure, attempt)
        cap = min(retry.max_backoff_ms, retry.initial_backoff_ms * (2 ** (attempt - 1)))
        backoff = rng.uniform(0, cap) / 1000.0
        if remaining() <= backoff:
            return ("failed", failure, attempt)
        logger.info(
            "raypipe: retrying %s after %s (attempt %d of %d)", node.name, failure.kind, attempt, retry.attempts
        )
        await sleep(backoff)


async def call(run: Run, node: NodeSpec, document: Any) -> None:
    """Runs a ready node's call for `run` and settles the node with what it gave."""
    try:
        await _call_and_settle(run, node, document)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug here must not hang the request
        logger.exception("raypipe: internal error while running %s", node.name)
        run.fail(GraphError("INTERNAL", node.name, f"internal error of the graph runtime: {describe_exception(exc)}"))


async def call_shadow(run: Run, node: NodeSpec, document: Any) -> None:
    """A shadow call outlives the response, so the request deadline bounds it here."""
    scope = timeouts.timeout_at(run.loop.time() + max(0.0, run.remaining()))
    try:
        async with scope:
            await call(run, node, document)
    except asyncio.TimeoutError:
        if not scope.expired():
            raise
        logger.warning("raypipe: shadow node %s ran out of the request deadline", node.name)
        run.settle(node.name, SKIPPED, reason="ran out of the request deadline")


async def _call_and_settle(run: Run, node: NodeSpec, document: Any) -> None:
    name = node.name
    graph = run.g
    shadow = name in graph.shadow
    try:
        headers = run.forwarded if name in run.x.header_nodes else None
        args, kwargs = call_args(node, document, graph, headers)
    except GraphError as error:
        if error.code == "INVALID_INPUT" and not shadow:
            run.fail(error)
            return
        node_failed(run, node, Failure("INPUT", error.message, 0, code=error.code))
        return
    executor = run.x
    caller = executor.callers[name]
    if not run.timed:
        kind, value, tries = await attempts(
            node, caller, args, kwargs, remaining=run.remaining, rng=executor.rng, sleep=executor.sleep
        )
    else:
        started = _call_started(run, shadow)
        try:
            kind, value, tries = await attempts(
                node, caller, args, kwargs, remaining=run.remaining, rng=executor.rng, sleep=executor.sleep
            )
        except asyncio.CancelledError:
            _call_cancelled(run, name, shadow, started)
            raise
        _call_ended(run, name, shadow, started, {"attempts": tries})
        if kind == "ok":
            run.observe_outcome(name, OUTCOME_OK)
        elif kind == "deadline":
            run.observe_outcome(name, OUTCOME_SHADOW_FAILED if shadow else OUTCOME_TIMEOUT)
    if kind == "ok":
        run.settle(name, DONE, value)
    elif kind == "deadline":
        if shadow:
            logger.warning("raypipe: shadow node %s ran out of the request deadline", name)
            run.settle(name, SKIPPED, reason="ran out of the request deadline")
        else:
            run.on_deadline()
    else:
        node_failed(run, node, value)


def _call_started(run: Run, shadow: bool) -> float:
    now = run.x.clock()
    if not shadow:
        if run.in_flight == 0:
            run.busy_since = now
        run.in_flight += 1
    return now


def _call_ended(run: Run, name: str, shadow: bool, started: float, info: dict, observe: bool = True) -> None:
    """Closes a timed call: the busy time of the overhead, the trace, the observer."""
    now = run.x.clock()
    if not shadow:
        run.in_flight -= 1
        if run.in_flight == 0:
            run.busy += now - run.busy_since
    ms = (now - started) * 1000
    if run.trace:
        info["ms"] = round(ms, 3)
        run.info[name] = info
    observer = run.x.observer
    if observe and observer is not None:
        try:
            observer.node_call(name, ms)
        except Exception:
            run.x.observer_failed()


def _call_cancelled(run: Run, name: str, shadow: bool, started: float) -> None:
    """A call cut short: by the deadline (a shadow's own or the request's), or because nothing
    needs it any more (a lost race, a failed request, a client gone): skipped, not timed."""
    if shadow:
        outcome = OUTCOME_SHADOW_FAILED
    elif run.remaining() <= 0:
        outcome = OUTCOME_TIMEOUT
    else:
        outcome = OUTCOME_SKIPPED
    _call_ended(run, name, shadow, started, {"cancelled": True}, observe=outcome != OUTCOME_SKIPPED)
    run.observe_outcome(name, outcome)


def node_failed(run: Run, node: NodeSpec, failure: Failure) -> None:
    """Applies the node's on_error policy to a failure of its call or its input (a shadow's is
    only logged)."""
    name = node.name
    graph = run.g
    if run.x.observer is not None:
        run.observe_outcome(name, failure_outcome(node, failure.kind, name in graph.shadow))
    if name in graph.shadow:
        logger.warning("raypipe: shadow node %s failed (%s): %s", name, failure.kind, failure.message)
        return run.settle(name, FAILED, reason=f"failed: {failure.message}")
    if node.on_error == "SKIP":
        logger.info("raypipe: node %s failed and is skipped: %s", name, failure.message)
        run.soft_failed.append(name)
        return run.settle(name, FAILED, reason=f"failed: {failure.message}")
    if node.on_error == "FALLBACK":
        logger.info("raypipe: node %s failed; using its fallback value: %s", name, failure.message)
        run.fallbacks.append(name)
        return run.settle(name, DONE, copy.deepcopy(node.fallback_value))
    code = failure.code or FAILURE_CODES.get(failure.kind, "NODE_FAILED")
    run.fail(
        GraphError(
            code,
            name,
            f"{name}: {failure.message}",
            failure.attempts,
            status=failure.status,
            retry_after=failure.retry_after,
        )
    )
