"""The graph executor: runs one request through a parsed graph, with no dependency on Ray.

Model nodes are called through plain async callables (`callers[node_name](*args, **kwargs)`),
so the same engine runs under Ray Serve (callables wrap DeploymentHandles, see app.py) and in
tests (plain coroutines). Semantics (proto/raypipe/v1/pipeline.proto, graph-semantics.md §7):

- Node states PENDING -> RUNNING -> DONE | SKIPPED | FAILED. An edge is live when its source is
  DONE, its guard (`when`) holds and, out of a SWITCH or SPLIT, it is the chosen edge; dead when
  its source is skipped (or soft-failed), its guard is false or it was not chosen.
- join ALL: runs when every in-edge is settled, every non-optional one live and at least one
  live; skipped as soon as a non-optional in-edge is dead. join ANY: runs with the first live
  in-edge; skipped when all are dead. Joins never wait for something that cannot come.
- Independent branches run concurrently. A request runs in the coroutine that called `run`:
  while a single model call is ready and nothing else is in flight (a straight path), that
  call is awaited right there; only real fan-out (two or more calls at once) and shadow nodes
  get asyncio tasks. Work no remaining consumer needs (e.g. the losing branch of a join ANY)
  is cancelled.
- The request deadline is one timer around the whole request; a node's own `timeout_ms` is
  one more (`asyncio.timeout`) around each of its attempts, set only when it ends before the
  deadline. Retries with exponential backoff and full jitter, only for the listed failure
  classes, never past the deadline. on_error FAIL fails the request (in-flight work is
  cancelled), SKIP makes the node skipped, FALLBACK makes its output `fallback_value`. An
  error is never passed on as data.
- Shadow nodes (and nodes fed only by them) run on a sample of requests; the response never
  waits for them and their failures are only logged.
- The OUTPUT node's assembled input is the response; dead optional parts are listed in the
  `x-raypipe-partial` header, switch/split choices in `x-raypipe-route`. A node's backpressure
  (its Serve queue is full) answers 503 with a `Retry-After` header.
- An optional `Observer` (metrics.py binds one to Ray Serve's metrics) hears each model node's
  outcome and call time and each request's status and graph overhead; see `Observer`.

This module is the engine's public face (`Executor` and the names app.py, router.py and
metrics.py use); the work is done by scheduler.py (one request's walk through the graph),
node_call.py (calling one node: attempts, timeouts, retries, on_error), assembly.py (a node's
input from upstream outputs), response.py (the result and its headers), errors.py, observer.py,
states.py and timeouts.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from .errors import (
    DEFAULT_RETRY_AFTER_S,
    MAX_MESSAGE,
    STATUS,
    Backpressure,
    GraphError,
    Unavailable,
    describe_exception,
    http_status_of,
    retry_after_seconds,
)
from .node_call import Caller
from .observer import (
    OUTCOME_ERROR,
    OUTCOME_FALLBACK,
    OUTCOME_OK,
    OUTCOME_SHADOW_FAILED,
    OUTCOME_SKIPPED,
    OUTCOME_TIMEOUT,
    OUTCOMES,
    Observer,
    failure_outcome,
)
from .response import (
    HEADER_FALLBACK,
    HEADER_GRAPH,
    HEADER_PARTIAL,
    HEADER_RETRY_AFTER,
    HEADER_ROUTE,
    HEADER_SERVER_TIMING,
    HEADER_TRACE,
    Result,
)
from .scheduler import Run, canonical_json, sticky_choice
from .spec import GraphSpec
from .states import DONE, FAILED, PENDING, RUNNING, SKIPPED

# The engine's public names, wherever they live (app.py, router.py, metrics.py and the tests
# import them from here).
__all__ = [
    "DEFAULT_RETRY_AFTER_S",
    "DONE",
    "FAILED",
    "HEADER_FALLBACK",
    "HEADER_GRAPH",
    "HEADER_PARTIAL",
    "HEADER_RETRY_AFTER",
    "HEADER_ROUTE",
    "HEADER_SERVER_TIMING",
    "HEADER_TRACE",
    "MAX_MESSAGE",
    "OUTCOMES",
    "OUTCOME_ERROR",
    "OUTCOME_FALLBACK",
    "OUTCOME_OK",
    "OUTCOME_SHADOW_FAILED",
    "OUTCOME_SKIPPED",
    "OUTCOME_TIMEOUT",
    "PENDING",
    "RUNNING",
    "SKIPPED",
    "STATUS",
    "Backpressure",
    "Caller",
    "Executor",
    "GraphError",
    "Observer",
    "Result",
    "Unavailable",
    "canonical_json",
    "describe_exception",
    "failure_outcome",
    "http_status_of",
    "retry_after_seconds",
    "sticky_choice",
]

logger = logging.getLogger("raypipe_runtime")


class Executor:
    """Runs requests through one graph.

    callers: node name -> async callable, called as `await callers[name](document)` (SINGLE_ARG)
    or `await callers[name](**document)` (KWARGS), plus `headers=` for nodes in `header_nodes`.
    It raises `Unavailable` / `Backpressure` for those failure classes; any other exception is
    an application error of the node. `observer` (an `Observer`, optional) hears outcomes and
    timings; without it and without a trace, no call is timed.
    """

    def __init__(
        self,
        graph: GraphSpec,
        callers: Mapping[str, Caller],
        *,
        header_nodes=(),
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        observer: Observer | None = None,
    ):
        missing = [n.name for n in graph.model_nodes() if n.name not in callers]
        if missing:
            raise ValueError(f"no caller for model node(s) {', '.join(missing)}")
        self.graph = graph
        self.callers = dict(callers)
        self.header_nodes = frozenset(header_nodes)
        self.rng = rng or random.Random()
        self.clock = clock
        self.sleep = sleep
        self.observer = observer
        self._observer_broken = False
        self._tasks: set = set()
        # What every request would otherwise work out again.
        self.initial_state = dict.fromkeys(graph.nodes, PENDING)
        self.graph_header = f"{graph.name}@{graph.version}" if graph.version else graph.name
        self.deadline_s = graph.deadline_ms / 1000.0
        self.scope_names = {
            name: (*[a for a in graph.order if a in graph.ancestors[name]], name) for name in graph.order
        }
        self.switch_routes = {}
        self.split_routes = {}
        for node in graph.nodes.values():
            outs = graph.out_edges[node.name]
            if node.kind == "switch":
                cases = sorted((e for e in outs if e.when is not None), key=lambda e: (e.order, e.index))
                self.switch_routes[node.name] = (cases, next((e for e in outs if e.when is None), None))
            elif node.kind == "split":
                weighted = [e for e in outs if (e.weight or 0) > 0]
                self.split_routes[node.name] = (weighted, sum(e.weight for e in weighted))
        prunable = set(_prunable(graph))
        self.prunable = tuple(name for name in graph.order if name in prunable)

    async def run(self, request: Any, headers: Mapping[str, str] | None = None) -> Result:
        """Runs one request (its parsed body) and returns the response. Never raises for graph
        or model failures (they become error responses); cancellation propagates."""
        run = Run(self, request, {k.lower(): v for k, v in (headers or {}).items()})
        return await run.execute()

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Waits for background work (shadow branches) of finished requests."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._tasks:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait(set(self._tasks), timeout=remaining)
            if deadline is not None and time.monotonic() >= deadline:
                return

    def track(self, task: asyncio.Task) -> None:
        """Keeps a background task of a request referenced until it ends."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def observer_failed(self) -> None:
        """An observer call raised: logged once per executor, the request goes on."""
        if not self._observer_broken:
            self._observer_broken = True
            logger.exception("raypipe: the metrics observer failed; its errors are ignored from now on")


def _prunable(graph: GraphSpec) -> Iterator[str]:
    """Model nodes whose call may stop being needed while it runs: every consumer has another
    in-edge, which can fire it (join ANY) or skip it (join ALL) first. A node with a consumer
    that waits only for it stays needed, so straight paths never look for work to cancel."""
    for node in graph.model_nodes():
        name = node.name
        outs = graph.out_edges[name]
        if name == graph.output or name in graph.shadow or not outs:
            continue
        if all(len(graph.in_edges[e.target]) > 1 for e in outs):
            yield name
