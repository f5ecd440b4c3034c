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
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Optional

from . import pointer as jp
from . import predicate as pred
from .spec import MISSING, EdgeSpec, GraphSpec, NodeSpec

logger = logging.getLogger("raypipe_runtime")

PENDING, RUNNING, DONE, SKIPPED, FAILED = "PENDING", "RUNNING", "DONE", "SKIPPED", "FAILED"

HEADER_ROUTE = "x-raypipe-route"
HEADER_PARTIAL = "x-raypipe-partial"
HEADER_FALLBACK = "x-raypipe-fallback"
HEADER_GRAPH = "x-raypipe-graph"
HEADER_TRACE = "x-raypipe-trace"
HEADER_RETRY_AFTER = "retry-after"
HEADER_SERVER_TIMING = "server-timing"

# Seconds a client is told to wait after a node's backpressure when Serve names no delay of
# its own (`backpressure_config.retry_after_s`): a full queue drains within a few calls of the
# node, and HTTP counts whole seconds.
DEFAULT_RETRY_AFTER_S = 1

# Error codes and their HTTP statuses.
STATUS = {
    "INVALID_INPUT": 400,
    "NO_ROUTE": 422,
    "OUTPUT_SKIPPED": 422,
    "NODE_FAILED": 502,
    "NODE_INPUT": 502,
    "SELECT_MISSING": 502,
    "UNAVAILABLE": 502,
    "BACKPRESSURE": 503,
    "TIMEOUT": 504,
    "DEADLINE": 504,
    "INTERNAL": 500,
}

MAX_MESSAGE = 1000


class Unavailable(Exception):
    """Raised by a caller when the deployment's replica died or could not be reached."""


class Backpressure(Exception):
    """Raised by a caller when the call was rejected because the queue was full.
    `retry_after_s`: how long the client should wait, when the deployment says."""

    def __init__(self, message: str = "", retry_after_s: Optional[float] = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after_seconds(retry_after_s: Optional[float]) -> int:
    """The `Retry-After` value (whole seconds, rounded up, as Serve does) for a delay."""
    if isinstance(retry_after_s, (int, float)) and not isinstance(retry_after_s, bool) \
            and math.isfinite(retry_after_s) and retry_after_s >= 0:
        return math.ceil(retry_after_s)
    return DEFAULT_RETRY_AFTER_S


class GraphError(Exception):
    """A request failure: {"error": {code, node, message, attempts}} with an HTTP status."""

    def __init__(self, code: str, node: Optional[str], message: str, attempts: int = 0,
                 status: Optional[int] = None, retry_after: Optional[int] = None):
        super().__init__(message)
        self.code = code
        self.node = node
        self.message = message[:MAX_MESSAGE]
        self.attempts = attempts
        self.status = status or STATUS.get(code, 500)
        self.retry_after = retry_after  # seconds, for the Retry-After header

    def body(self) -> dict:
        error = {"code": self.code, "node": self.node, "message": self.message}
        if self.attempts:
            error["attempts"] = self.attempts
        return {"error": error}


@dataclass
class Result:
    """What the executor answers: an HTTP status, a JSON-able body and response headers."""

    status: int
    body: Any
    headers: dict = field(default_factory=dict)
    error: Optional[GraphError] = None


@dataclass
class _Failure:
    kind: str  # UNAVAILABLE, BACKPRESSURE, TIMEOUT, APP_ERROR, INPUT
    message: str
    attempts: int
    status: Optional[int] = None
    code: Optional[str] = None
    retry_after: Optional[int] = None


def describe_exception(exc: BaseException) -> str:
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def http_status_of(exc: BaseException) -> Optional[int]:
    """An HTTP status < 500 that a user exception carries (`status_code` or `status`)."""
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value < 500:
            return value
    return None


class _Dead:
    pass


_DEAD = _Dead()


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sticky_choice(value, total: int) -> int:
    """A stable point in [0, total) for a sticky split: sha256 of the value's canonical JSON."""
    digest = hashlib.sha256(canonical_json(value).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % total


Caller = Callable[..., Awaitable[Any]]

# A model node's outcome in one request, as the observer hears it (one per node and request
# that reached it): what the node's call did.
OUTCOME_OK = "ok"  # called and answered
OUTCOME_ERROR = "error"  # its call or its input failed, no fallback (on_error FAIL or SKIP)
OUTCOME_TIMEOUT = "timeout"  # its own timeout_ms or the request deadline ended it (FAIL or SKIP)
OUTCOME_FALLBACK = "fallback"  # failed in any way; its fallback_value was used
OUTCOME_SKIPPED = "skipped"  # never called (routed around, dead input, not sampled, not needed),
#                             or its call was cancelled because nothing needed it any more
OUTCOME_SHADOW_FAILED = "shadow_failed"  # a shadow node failed in any way (timeouts included)
OUTCOMES = (OUTCOME_OK, OUTCOME_ERROR, OUTCOME_TIMEOUT, OUTCOME_FALLBACK, OUTCOME_SKIPPED,
            OUTCOME_SHADOW_FAILED)


def failure_outcome(node: NodeSpec, failure_kind: str, shadow: bool) -> str:
    """The outcome of a node whose call (or input) failed with a `_Failure` kind."""
    if shadow:
        return OUTCOME_SHADOW_FAILED
    if node.on_error == "FALLBACK":
        return OUTCOME_FALLBACK
    return OUTCOME_TIMEOUT if failure_kind == "TIMEOUT" else OUTCOME_ERROR


class Observer:
    """What an executor tells about its requests (metrics.py binds it to Ray Serve's metrics).
    Called on the request's event loop, so every method must be cheap; an exception is logged
    once and otherwise ignored, never failing a request.

    - `node_outcome(node, outcome)`: once per model node and request that reached it (OUTCOMES);
      nodes still pending when the response went out are not counted, nor a call cancelled
      before its task first ran (calls over a handle suspend at once, so hardly ever).
    - `node_call(node, ms)`: the time of a node's call, retries and their backoff included, for
      every call except one cancelled because nothing needed it any more.
    - `request(status, overhead_ms)`: once per answered request (not when the client went away).
      The graph overhead is the request's time in the executor (from `Executor.run` until its
      response is decided) minus the time during which at least one non-shadow node call was in
      flight: what the graph itself added to the request's latency (routing, input assembly,
      predicates, scheduling), while work that overlapped a node call is not counted.
    """

    def node_outcome(self, node: str, outcome: str) -> None:
        pass

    def node_call(self, node: str, ms: float) -> None:
        pass

    def request(self, status: int, overhead_ms: float) -> None:
        pass

_FAILURE_CODES = {"UNAVAILABLE": "UNAVAILABLE", "BACKPRESSURE": "BACKPRESSURE", "TIMEOUT": "TIMEOUT"}


class _Timeout:
    """`asyncio.timeout_at` for Python 3.10 (Ray 2.60 still runs on it): cancels the running task
    at `when` (loop time) and turns that cancellation into TimeoutError on the way out."""

    def __init__(self, when: float):
        self._when = when
        self._expired = False
        self._handle = None

    def expired(self) -> bool:
        return self._expired

    async def __aenter__(self):
        task = asyncio.current_task()
        self._handle = asyncio.get_running_loop().call_at(self._when, self._expire, task)
        return self

    def _expire(self, task) -> None:
        self._expired = True
        task.cancel()

    async def __aexit__(self, exc_type, exc, tb):
        self._handle.cancel()
        if self._expired and exc_type is asyncio.CancelledError:
            raise asyncio.TimeoutError from exc
        return None


_timeout_at = getattr(asyncio, "timeout_at", _Timeout)


def _cancel_requested() -> bool:
    """Whether the running task is being cancelled (by a timeout, the request's end or its
    client), as opposed to a callee raising CancelledError of its own. Python 3.10 cannot tell
    the two apart: there a CancelledError always counts as a cancellation of the request."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling() > 0 if cancelling is not None else True


class _NodeTimeout(Exception):
    """A node's own timeout ended an attempt."""


async def _call_once(caller: Caller, args, kwargs, timeout: Optional[float]):
    """One call, bounded by `timeout` seconds when given; awaited directly when not."""
    if timeout is None:
        return await caller(*args, **kwargs)
    scope = _timeout_at(asyncio.get_running_loop().time() + timeout)
    try:
        async with scope:
            return await caller(*args, **kwargs)
    except asyncio.TimeoutError:
        if scope.expired():
            raise _NodeTimeout from None
        raise


class Executor:
    """Runs requests through one graph.

    callers: node name -> async callable, called as `await callers[name](document)` (SINGLE_ARG)
    or `await callers[name](**document)` (KWARGS), plus `headers=` for nodes in `header_nodes`.
    It raises `Unavailable` / `Backpressure` for those failure classes; any other exception is
    an application error of the node. `observer` (an `Observer`, optional) hears outcomes and
    timings; without it and without a trace, no call is timed.
    """

    def __init__(self, graph: GraphSpec, callers: Mapping[str, Caller], *,
                 header_nodes=(), rng: Optional[random.Random] = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 observer: Optional[Observer] = None):
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
        self.initial_state = {name: PENDING for name in graph.nodes}
        self.graph_header = f"{graph.name}@{graph.version}" if graph.version else graph.name
        self.deadline_s = graph.deadline_ms / 1000.0
        self.scope_names = {name: (*[a for a in graph.order if a in graph.ancestors[name]], name)
                            for name in graph.order}
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

    async def run(self, request: Any, headers: Optional[Mapping[str, str]] = None) -> Result:
        """Runs one request (its parsed body) and returns the response. Never raises for graph
        or model failures (they become error responses); cancellation propagates."""
        run = _Run(self, request, {k.lower(): v for k, v in (headers or {}).items()})
        return await run.execute()

    async def wait_idle(self, timeout: Optional[float] = None) -> None:
        """Waits for background work (shadow branches) of finished requests."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._tasks:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait(set(self._tasks), timeout=remaining)
            if deadline is not None and time.monotonic() >= deadline:
                return

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _observer_failed(self) -> None:
        """An observer call raised: logged once per executor, the request goes on."""
        if not self._observer_broken:
            self._observer_broken = True
            logger.exception("raypipe: the metrics observer failed; its errors are ignored from now on")


def _prunable(graph: GraphSpec):
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


class _Run:
    def __init__(self, executor: Executor, request: Any, headers: dict):
        self.x = executor
        self.g = executor.graph
        self.request = request
        self.headers = headers
        self.forwarded = ({h: headers[h] for h in self.g.forward_headers if h in headers}
                          if executor.header_nodes else {})
        self.trace = HEADER_TRACE in headers and headers[HEADER_TRACE].strip().lower() in ("1", "true", "yes")
        # Node calls are timed only for a trace or an observer; see Observer for the overhead.
        self.timed = self.trace or executor.observer is not None
        if self.timed:  # only timed requests read these
            self.in_flight = 0  # non-shadow node calls in flight
            self.busy_since = 0.0  # when in_flight last went from 0 to 1
            self.busy = 0.0  # seconds with at least one non-shadow call in flight, until busy_since
            self.overhead_ms = 0.0
        self.state = dict(executor.initial_state)
        self.values: dict = {}
        self.reasons: dict = {}
        self.edge_live: dict = {}  # edge index -> bool
        self.routes: list = []
        self.chosen: dict = {}  # switch/split name -> chosen edge index
        self.fallbacks: list = []
        self.soft_failed: list = []
        self.info: dict = {}  # node name -> attempts and time, kept only for x-raypipe-trace
        self.ready: list = []  # (node, document) of model calls (not shadow) ready to start
        self.tasks: dict = {}  # node name -> task, for calls (not shadow) that run side by side
        self.result: Optional[Result] = None
        self.wake: Optional[asyncio.Future] = None  # the request's coroutine waits on tasks
        self.loop = asyncio.get_running_loop()
        self.start = executor.clock()
        self.deadline = self.start + executor.deadline_s
        self.queue: deque = deque()
        self.draining = False

    # ---- lifecycle ------------------------------------------------------------------------

    async def execute(self) -> Result:
        """Drives the request in the calling coroutine: runs a lone ready call right here,
        starts tasks when calls can run side by side, and waits for them otherwise."""
        scope = _timeout_at(self.loop.time() + max(0.0, self._remaining()))
        try:
            async with scope:
                self._settle(self.g.ingress, DONE, self.request)
                while self.result is None:
                    ready = self.ready
                    if ready:
                        if len(ready) == 1 and not self._in_flight():
                            await self._call(*ready.pop())
                            continue
                        for node, document in ready:
                            self._start_task(node, document)
                        ready.clear()
                    self.wake = self.loop.create_future()
                    await self.wake
        except asyncio.TimeoutError:
            if not scope.expired():
                raise
            self._on_deadline()
        except asyncio.CancelledError:
            # The client went away (or Serve's own timeout hit): stop all non-shadow work.
            self._cancel_non_shadow()
            raise
        observer = self.x.observer
        if observer is not None:
            try:
                observer.request(self.result.status, self.overhead_ms)
            except Exception:
                self.x._observer_failed()
        return self.result

    def _in_flight(self) -> bool:
        return any(not task.done() for task in self.tasks.values())

    def _start_task(self, node: NodeSpec, document: Any) -> None:
        task = self.loop.create_task(self._call(node, document), name=f"raypipe:{node.name}")
        self.tasks[node.name] = task
        self.x._track(task)

    def _wake(self) -> None:
        """Lets the request's coroutine go on after a task settled something."""
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _remaining(self) -> float:
        return self.deadline - self.x.clock()

    def _respond(self, result: Result) -> None:
        if self.result is not None:
            return
        if self.timed:
            now = self.x.clock()
            busy = self.busy + (now - self.busy_since if self.in_flight else 0.0)
            self.overhead_ms = max(0.0, (now - self.start - busy) * 1000)
        result.headers.update(self._headers())
        if result.error is not None and result.error.retry_after is not None:
            result.headers[HEADER_RETRY_AFTER] = str(result.error.retry_after)
        self.result = result
        self._cancel_non_shadow()
        self._wake()

    def _fail(self, error: GraphError) -> None:
        if self.result is not None:
            return
        logger.info("raypipe: request failed: %s (node %s): %s", error.code, error.node, error.message)
        self._respond(Result(error.status, error.body(), error=error))

    def _on_deadline(self) -> None:
        running = [n for n in self.g.order if self.state[n] == RUNNING and n not in self.g.shadow]
        waiting = f" while waiting for {', '.join(running)}" if running else ""
        self._fail(GraphError("DEADLINE", running[0] if running else None,
                              f"the request deadline of {self.g.deadline_ms} ms passed{waiting}"))

    def _cancel_non_shadow(self) -> None:
        for task in self.tasks.values():
            if not task.done():
                task.cancel()

    def _headers(self) -> dict:
        h = {}
        if self.g.name:
            h[HEADER_GRAPH] = self.x.graph_header
        if self.routes:
            h[HEADER_ROUTE] = ",".join(self.routes)
        partial = self._partial()
        if partial:
            h[HEADER_PARTIAL] = ",".join(partial)
        if self.fallbacks:
            h[HEADER_FALLBACK] = ",".join(self.fallbacks)
        if self.trace:
            h[HEADER_TRACE] = json.dumps(self._trace(), separators=(",", ":"))
            h[HEADER_SERVER_TIMING] = self._server_timing()
        return h

    def _server_timing(self) -> str:
        """W3C Server-Timing: each node call finished so far, then the graph overhead as
        `_overhead` (node names start with a letter or digit, so it names no node)."""
        parts = [f"{name};dur={info['ms']}" for name, info in self.info.items() if "ms" in info]
        parts.append(f"_overhead;dur={round(self.overhead_ms, 3)}")
        return ", ".join(parts)

    def _partial(self) -> list:
        names = list(self.soft_failed)
        out = self.g.output
        if out and self.state.get(out) == DONE and self.g.nodes[out].join == "ALL":
            for e in self.g.in_edges[out]:
                if e.optional and not self.edge_live.get(e.index, False) and e.source not in names:
                    names.append(e.source)
        return names

    def _trace(self) -> dict:
        return {
            name: {"state": self.state[name], **self.info.get(name, {}),
                   **({"reason": self.reasons[name]} if name in self.reasons else {})}
            for name in self.g.order
            if self.state[name] != PENDING or name in self.info
        }

    # ---- the event loop of one request ------------------------------------------------------

    def _settle(self, name: str, state: str, value: Any = None, reason: Optional[str] = None) -> None:
        """Records that a node finished (or was skipped), then lets its consumers proceed.
        Iterative (a queue), so long chains of routing nodes do not recurse."""
        queue = self.queue
        queue.append((name, state, value, reason))
        if self.draining:
            return
        self.draining = True
        try:
            while queue:
                item = queue.popleft()
                try:
                    self._apply(*item)
                except GraphError as error:
                    self._fail(error)
                except Exception as exc:  # a bug here must not hang the request
                    logger.exception("raypipe: internal error while settling %s", item[0])
                    self._fail(GraphError("INTERNAL", item[0], f"internal error of the graph runtime: {describe_exception(exc)}"))
            if self.result is None and self.tasks and self.x.prunable:
                self._prune()
        finally:
            self.draining = False
        if self.ready or self.result is not None:
            self._wake()

    def _apply(self, name: str, state: str, value: Any, reason: Optional[str]) -> None:
        prior = self.state[name]
        if prior in (DONE, SKIPPED, FAILED):
            return
        self.state[name] = state
        if state == DONE:
            self.values[name] = value
        else:
            if reason:
                self.reasons[name] = reason
            if (state == SKIPPED and prior == PENDING and self.x.observer is not None
                    and self.g.nodes[name].kind == "model"):
                self._observe_outcome(name, OUTCOME_SKIPPED)  # never called
        if name == self.g.output:
            self._finish()
            return
        node = self.g.nodes[name]
        outs = self.g.out_edges[name]
        if state != DONE:
            for e in outs:
                self.edge_live[e.index] = False
        elif node.kind in ("switch", "split"):
            chosen = self.chosen.get(name)
            for e in outs:
                self.edge_live[e.index] = e.index == chosen
        else:
            scope = None
            for e in outs:
                if e.when is None:
                    self.edge_live[e.index] = True
                else:
                    if scope is None:
                        scope = self._scope(name)
                    self.edge_live[e.index] = self._evaluate(e.when, scope, f"the guard of edge {e.label}", name)
        for e in outs:
            self._try_fire(e.target)

    def _finish(self) -> None:
        out = self.g.output
        if self.state[out] == DONE:
            self._respond(Result(200, self.values[out]))
        else:
            self._fail(GraphError("OUTPUT_SKIPPED", out, f"the response could not be assembled: {self._skip_chain(out)}"))

    def _skip_chain(self, name: str) -> str:
        """Why a node was skipped, followed upstream to the first cause."""
        parts = []
        seen = set()
        while name not in seen:
            seen.add(name)
            reason = self.reasons.get(name, "skipped")
            parts.append(f"{name} ({reason})")
            dead = [e for e in self.g.in_edges[name]
                    if not self.edge_live.get(e.index, True) and self.state[e.source] in (SKIPPED, FAILED)
                    and not e.optional]
            if not dead:
                dead = [e for e in self.g.in_edges[name] if self.state[e.source] in (SKIPPED, FAILED)]
            if not dead:
                break
            name = dead[0].source
        return " <- ".join(parts)

    def _scope(self, source: str) -> dict:
        state, values = self.state, self.values
        return {name: values[name] for name in self.x.scope_names[source] if state[name] == DONE}

    def _evaluate(self, predicate, scope, what: str, node: str) -> bool:
        try:
            return pred.evaluate(predicate, scope)
        except jp.RawBodyError as e:
            raise GraphError("INVALID_INPUT", node,
                             f"{what} reads {e.args[0]} but the request body is not JSON") from None

    # ---- firing ------------------------------------------------------------------------------

    def _try_fire(self, name: str) -> None:
        if self.state[name] != PENDING:
            return
        node = self.g.nodes[name]
        ins = self.g.in_edges[name]
        live = [e for e in ins if self.edge_live.get(e.index) is True]
        if node.join == "ANY":
            if live:
                return self._fire(node, live[:1], [])
            if all(e.index in self.edge_live for e in ins):
                return self._skip(name, "every in-edge is dead")
            return
        # join ALL: skip as soon as a required edge is dead.
        for e in ins:
            if not e.optional and self.edge_live.get(e.index) is False:
                return self._skip(name, f"needs {e.source}, which {self._dead_why(e)}")
        if not all(e.index in self.edge_live for e in ins):
            return
        if not live:
            return self._skip(name, "every in-edge is dead")
        dead_optional = [e for e in ins if e.optional and not self.edge_live[e.index]]
        self._fire(node, live, dead_optional)

    def _dead_why(self, e: EdgeSpec) -> str:
        state = self.state[e.source]
        if state == FAILED:
            return "failed"
        if state == SKIPPED:
            return "was skipped"
        src = self.g.nodes[e.source]
        if src.kind in ("switch", "split"):
            return f"routed the request elsewhere ({src.kind})"
        return "did not pass its guard"

    def _skip(self, name: str, reason: str) -> None:
        self._settle(name, SKIPPED, reason=reason)

    def _needed(self, name: str) -> bool:
        if name == self.g.output or name in self.g.shadow:
            return True
        outs = self.g.out_edges[name]
        return not outs or any(self.state[e.target] == PENDING for e in outs)

    def _fire(self, node: NodeSpec, live: list, dead_optional: list) -> None:
        name = node.name
        if self.result is not None and name not in self.g.shadow:
            return  # the response is out: only shadow branches still run
        # A live optional edge whose selection does not resolve counts as dead: decide again.
        for e in live:
            if e.mode == "DATA" and e.optional and self._take(node, e) is _DEAD:
                self.edge_live[e.index] = False
                return self._try_fire(name)
        if node.kind == "model" and not self._needed(name):
            return self._skip(name, "no longer needed")
        if name in self.g.shadow and node.shadow_percent is not None and node.shadow_percent < 100:
            if self.x.rng.random() * 100 >= node.shadow_percent:
                return self._skip(name, "not sampled")
        try:
            document = self._assemble(node, live, dead_optional)
        except GraphError as error:
            if error.code == "INVALID_INPUT" or node.kind != "model":
                raise
            return self._node_failed(node, _Failure("INPUT", error.message, 0, code=error.code))
        if node.kind == "output":
            return self._settle(name, DONE, document)
        if node.kind == "switch":
            return self._route_switch(node, document)
        if node.kind == "split":
            return self._route_split(node, document)
        if node.kind == "model":
            self.state[name] = RUNNING
            if name in self.g.shadow:
                # Never awaited by the request: a task of its own, bounded by the deadline.
                task = self.loop.create_task(self._call_shadow(node, document), name=f"raypipe:{name}")
                self.x._track(task)
            else:
                self.ready.append((node, document))
            return
        raise GraphError("INTERNAL", name, f"cannot run a node of kind {node.kind}")

    def _route_switch(self, node: NodeSpec, document: Any) -> None:
        cases, default = self.x.switch_routes[node.name]
        scope = self._scope_with(node.name, document)
        chosen = None
        for e in cases:
            if self._evaluate(e.when, scope, f"the case {e.label}", node.name):
                chosen = e
                break
        if chosen is None:
            chosen = default
        if chosen is None:
            if node.on_no_match == "SKIP":
                return self._skip(node.name, "no case matched")
            raise GraphError("NO_ROUTE", node.name, f"no case of switch {node.name} matched the request and it has no default")
        self._choose(node.name, chosen)
        self._settle(node.name, DONE, document)

    def _route_split(self, node: NodeSpec, document: Any) -> None:
        outs, total = self.x.split_routes[node.name]
        if total <= 0:
            raise GraphError("NO_ROUTE", node.name, f"split {node.name} has no branch with a weight above 0")
        point = None
        if node.sticky_key:
            scope = self._scope_with(node.name, document)
            try:
                key = jp.lookup(scope, node.sticky_key)
            except jp.RawBodyError:
                raise GraphError("INVALID_INPUT", node.name,
                                 f"the sticky key {node.sticky_key} of split {node.name} reads a request body that is not JSON") from None
            if key is not jp.MISSING:
                point = sticky_choice(key, total)
        if point is None:
            point = self.x.rng.randrange(total)
        chosen = outs[-1]
        for e in outs:
            if point < e.weight:
                chosen = e
                break
            point -= e.weight
        self._choose(node.name, chosen)
        self._settle(node.name, DONE, document)

    def _scope_with(self, name: str, value: Any) -> dict:
        scope = self._scope(name)
        scope[name] = value
        return scope

    def _choose(self, name: str, edge: EdgeSpec) -> None:
        self.chosen[name] = edge.index
        self.routes.append(f"{name}={edge.target}")

    # ---- input assembly ------------------------------------------------------------------------

    def _assemble(self, node: NodeSpec, live: list, dead_optional: list) -> Any:
        data = [e for e in live if e.mode == "DATA"]
        fills = [e for e in dead_optional if e.mode == "DATA" and e.if_missing is not MISSING]
        if (node.input_template is MISSING and len(data) == 1 and data[0].into == ""
                and data[0].tensors is None and not fills):
            return self._take(node, data[0])
        document = copy.deepcopy(node.input_template) if node.input_template is not MISSING else {}
        writers = sorted([(e, True) for e in data] + [(e, False) for e in fills], key=lambda p: p[0].index)
        for e, is_live in writers:
            if not is_live:
                if e.tensors is not None:
                    continue
                value = copy.deepcopy(e.if_missing)
            else:
                value = self._take(node, e)
            if e.tensors is not None and is_live:
                document = self._append_tensors(node, e, document, value)
                continue
            try:
                document = jp.write(document, e.into, value)
            except ValueError as exc:
                raise GraphError("NODE_INPUT", node.name, f"edge {e.label}: {exc}") from None
        return document

    def _take(self, node: NodeSpec, e: EdgeSpec) -> Any:
        value = self.values[e.source]
        if e.tensors is not None:
            tensors = []
            outputs = value.get("outputs") if isinstance(value, dict) else None
            for tensor_name in e.tensors.names:
                found = None
                if isinstance(outputs, list):
                    found = next((t for t in outputs if isinstance(t, dict) and t.get("name") == tensor_name), None)
                if found is None:
                    if e.optional:
                        return _DEAD
                    raise GraphError(self._select_code(e), node.name,
                                     f"edge {e.label}: output tensor {tensor_name!r} of {e.source} is missing")
                renamed = dict(found)
                renamed["name"] = e.tensors.rename.get(tensor_name, tensor_name)
                tensors.append(renamed)
            return tensors
        if not e.select:
            return value
        try:
            found = jp.lookup(value, e.select)
        except jp.RawBodyError:
            raise GraphError("INVALID_INPUT", node.name,
                             f"edge {e.label} selects {e.select} but the request body is not JSON") from None
        if found is jp.MISSING:
            if e.optional:
                return _DEAD
            raise GraphError(self._select_code(e), node.name,
                             f"edge {e.label}: {e.select} is not in the output of {e.source}")
        return found

    def _select_code(self, e: EdgeSpec) -> str:
        return "INVALID_INPUT" if e.source == self.g.ingress else "SELECT_MISSING"

    def _append_tensors(self, node, e, document, tensors):
        if not isinstance(document, dict):
            raise GraphError("NODE_INPUT", node.name, f"edge {e.label}: tensors need an object document")
        inputs = document.setdefault("inputs", [])
        if not isinstance(inputs, list):
            raise GraphError("NODE_INPUT", node.name, f"edge {e.label}: /inputs of the document is not a list")
        inputs.extend(tensors)
        return document

    # ---- model calls -----------------------------------------------------------------------------

    def _call_args(self, node: NodeSpec, document: Any):
        kwargs = {}
        if node.model.call_style == "KWARGS":
            if not isinstance(document, dict) or not all(isinstance(k, str) and k.isidentifier() for k in document):
                code = "INVALID_INPUT" if any(e.source == self.g.ingress for e in self.g.in_edges[node.name]) else "NODE_INPUT"
                raise GraphError(code, node.name,
                                 f"{node.name} takes keyword arguments, but its input is not an object with identifier keys")
            args, kwargs = (), dict(document)
        else:
            args = (document,)
        if node.name in self.x.header_nodes:
            kwargs["headers"] = dict(self.forwarded)
        return args, kwargs

    async def _call(self, node: NodeSpec, document: Any) -> None:
        try:
            await self._call_inner(node, document)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not hang the request
            logger.exception("raypipe: internal error while running %s", node.name)
            self._fail(GraphError("INTERNAL", node.name, f"internal error of the graph runtime: {describe_exception(exc)}"))

    async def _call_shadow(self, node: NodeSpec, document: Any) -> None:
        """A shadow call outlives the response, so the request deadline bounds it here."""
        scope = _timeout_at(self.loop.time() + max(0.0, self._remaining()))
        try:
            async with scope:
                await self._call(node, document)
        except asyncio.TimeoutError:
            if not scope.expired():
                raise
            logger.warning("raypipe: shadow node %s ran out of the request deadline", node.name)
            self._settle(node.name, SKIPPED, reason="ran out of the request deadline")

    async def _call_inner(self, node: NodeSpec, document: Any) -> None:
        name = node.name
        shadow = name in self.g.shadow
        try:
            args, kwargs = self._call_args(node, document)
        except GraphError as error:
            if error.code == "INVALID_INPUT" and not shadow:
                self._fail(error)
                return
            self._node_failed(node, _Failure("INPUT", error.message, 0, code=error.code))
            return
        if not self.timed:
            kind, value, attempts = await self._attempts(node, args, kwargs)
        else:
            started = self._call_started(shadow)
            try:
                kind, value, attempts = await self._attempts(node, args, kwargs)
            except asyncio.CancelledError:
                self._call_cancelled(name, shadow, started)
                raise
            self._call_ended(name, shadow, started, {"attempts": attempts})
            if kind == "ok":
                self._observe_outcome(name, OUTCOME_OK)
            elif kind == "deadline":
                self._observe_outcome(name, OUTCOME_SHADOW_FAILED if shadow else OUTCOME_TIMEOUT)
        if kind == "ok":
            self._settle(name, DONE, value)
        elif kind == "deadline":
            if shadow:
                logger.warning("raypipe: shadow node %s ran out of the request deadline", name)
                self._settle(name, SKIPPED, reason="ran out of the request deadline")
            else:
                self._on_deadline()
        else:
            self._node_failed(node, value)

    def _call_started(self, shadow: bool) -> float:
        now = self.x.clock()
        if not shadow:
            if self.in_flight == 0:
                self.busy_since = now
            self.in_flight += 1
        return now

    def _call_ended(self, name: str, shadow: bool, started: float, info: dict, observe: bool = True) -> None:
        """Closes a timed call: the busy time of the overhead, the trace, the observer."""
        now = self.x.clock()
        if not shadow:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.busy += now - self.busy_since
        ms = (now - started) * 1000
        if self.trace:
            info["ms"] = round(ms, 3)
            self.info[name] = info
        observer = self.x.observer
        if observe and observer is not None:
            try:
                observer.node_call(name, ms)
            except Exception:
                self.x._observer_failed()

    def _call_cancelled(self, name: str, shadow: bool, started: float) -> None:
        """A call cut short: by the deadline (a shadow's own or the request's), or because nothing
        needs it any more (a lost race, a failed request, a client gone): skipped, not timed."""
        if shadow:
            outcome = OUTCOME_SHADOW_FAILED
        elif self._remaining() <= 0:
            outcome = OUTCOME_TIMEOUT
        else:
            outcome = OUTCOME_SKIPPED
        self._call_ended(name, shadow, started, {"cancelled": True}, observe=outcome != OUTCOME_SKIPPED)
        self._observe_outcome(name, outcome)

    def _observe_outcome(self, name: str, outcome: str) -> None:
        observer = self.x.observer
        if observer is not None:
            try:
                observer.node_outcome(name, outcome)
            except Exception:
                self.x._observer_failed()

    async def _attempts(self, node: NodeSpec, args, kwargs):
        """Calls the node until it answers or its retries end: ("ok", value, attempts),
        ("failed", _Failure, attempts) or ("deadline", None, attempts). The request deadline
        itself is enforced around the whole request (and around each shadow call)."""
        retry = node.retry
        caller = self.x.callers[node.name]
        own_timeout = node.timeout_ms / 1000.0 if node.timeout_ms else None
        attempt = 0
        while True:
            attempt += 1
            remaining = self._remaining()
            if remaining <= 0:
                return ("deadline", None, attempt - 1)
            try:
                # The node's own timer only when it ends first; otherwise the deadline's does.
                timeout = own_timeout if own_timeout is not None and own_timeout < remaining else None
                return ("ok", await _call_once(caller, args, kwargs, timeout), attempt)
            except _NodeTimeout:
                failure = _Failure("TIMEOUT", f"attempt {attempt} timed out after {node.timeout_ms} ms", attempt)
            except asyncio.CancelledError:
                if _cancel_requested():
                    raise
                failure = _Failure("UNAVAILABLE", "the call was cancelled", attempt)
            except Unavailable as exc:
                failure = _Failure("UNAVAILABLE", describe_exception(exc), attempt)
            except Backpressure as exc:
                failure = _Failure("BACKPRESSURE", describe_exception(exc), attempt,
                                   retry_after=retry_after_seconds(exc.retry_after_s))
            except Exception as exc:
                failure = _Failure("APP_ERROR", describe_exception(exc), attempt, status=http_status_of(exc))
            if attempt >= retry.attempts or failure.kind not in retry.retry_on:
                return ("failed", failure, attempt)
            cap = min(retry.max_backoff_ms, retry.initial_backoff_ms * (2 ** (attempt - 1)))
            backoff = self.x.rng.uniform(0, cap) / 1000.0
            if self._remaining() <= backoff:
                return ("failed", failure, attempt)
            logger.info("raypipe: retrying %s after %s (attempt %d of %d)", node.name, failure.kind, attempt, retry.attempts)
            await self.x.sleep(backoff)

    def _node_failed(self, node: NodeSpec, failure: _Failure) -> None:
        name = node.name
        if self.x.observer is not None:
            self._observe_outcome(name, failure_outcome(node, failure.kind, name in self.g.shadow))
        if name in self.g.shadow:
            logger.warning("raypipe: shadow node %s failed (%s): %s", name, failure.kind, failure.message)
            return self._settle(name, FAILED, reason=f"failed: {failure.message}")
        if node.on_error == "SKIP":
            logger.info("raypipe: node %s failed and is skipped: %s", name, failure.message)
            self.soft_failed.append(name)
            return self._settle(name, FAILED, reason=f"failed: {failure.message}")
        if node.on_error == "FALLBACK":
            logger.info("raypipe: node %s failed; using its fallback value: %s", name, failure.message)
            self.fallbacks.append(name)
            return self._settle(name, DONE, copy.deepcopy(node.fallback_value))
        code = failure.code or _FAILURE_CODES.get(failure.kind, "NODE_FAILED")
        self._fail(GraphError(code, name, f"{name}: {failure.message}", failure.attempts, status=failure.status,
                              retry_after=failure.retry_after))

    # ---- demand-driven cancellation ----------------------------------------------------------------

    def _prune(self) -> None:
        changed = True
        while changed and self.result is None:
            changed = False
            for name in self.x.prunable:
                task = self.tasks.get(name)
                if task is not None and self.state[name] == RUNNING and not task.done() and not self._needed(name):
                    task.cancel()
                    self.state[name] = SKIPPED
                    self.reasons[name] = "no longer needed"
                    for e in self.g.out_edges[name]:
                        self.edge_live[e.index] = False
                    changed = True
