"""One request's walk through the graph: what runs when (node states, live and dead edges,
joins, switch and split routing, demand-driven cancellation) and when the response is decided.

A `Run` drives the request in the coroutine that called `Executor.run`: a lone ready call is
awaited right there, real fan-out gets tasks; each node's call is node_call.py's, each node's
input assembly.py's."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from . import node_call, timeouts
from . import pointer as jp
from . import predicate as pred
from .assembly import DEAD, assemble, take
from .errors import Failure, GraphError, describe_exception
from .observer import OUTCOME_SKIPPED
from .response import (
    HEADER_FALLBACK,
    HEADER_GRAPH,
    HEADER_PARTIAL,
    HEADER_RETRY_AFTER,
    HEADER_ROUTE,
    HEADER_SERVER_TIMING,
    HEADER_TRACE,
    Result,
    partial,
    server_timing,
    trace,
)
from .spec import EdgeSpec, NodeSpec
from .states import DONE, FAILED, PENDING, RUNNING, SETTLED, SKIPPED

if TYPE_CHECKING:
    from .engine import Executor

logger = logging.getLogger("raypipe_runtime")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sticky_choice(value: Any, total: int) -> int:
    """A stable point in [0, total) for a sticky split: sha256 of the value's canonical JSON."""
    digest = hashlib.sha256(canonical_json(value).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % total


class Run:
    """One request through `executor`'s graph."""

    def __init__(self, executor: Executor, request: Any, headers: dict):
        self.x = executor
        self.g = executor.graph
        self.request = request
        self.headers = headers
        self.forwarded = (
            {h: headers[h] for h in self.g.forward_headers if h in headers} if executor.header_nodes else {}
        )
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
        self.result: Result | None = None
        self.wake: asyncio.Future | None = None  # the request's coroutine waits on tasks
        self.loop = asyncio.get_running_loop()
        self.start = executor.clock()
        self.deadline = self.start + executor.deadline_s
        self.queue: deque = deque()
        self.draining = False

    # ---- lifecycle ------------------------------------------------------------------------

    async def execute(self) -> Result:
        """Drives the request in the calling coroutine: runs a lone ready call right here,
        starts tasks when calls can run side by side, and waits for them otherwise."""
        scope = timeouts.timeout_at(self.loop.time() + max(0.0, self.remaining()))
        try:
            async with scope:
                self.settle(self.g.ingress, DONE, self.request)
                while self.result is None:
                    ready = self.ready
                    if ready:
                        if len(ready) == 1 and not self._in_flight():
                            await node_call.call(self, *ready.pop())
                            continue
                        for node, document in ready:
                            self._start_task(node, document)
                        ready.clear()
                    self.wake = self.loop.create_future()
                    await self.wake
        except asyncio.TimeoutError:
            if not scope.expired():
                raise
            self.on_deadline()
        except asyncio.CancelledError:
            # The client went away (or Serve's own timeout hit): stop all non-shadow work.
            self._cancel_non_shadow()
            raise
        result = self.result
        assert result is not None  # the loop above ends only with one
        observer = self.x.observer
        if observer is not None:
            try:
                observer.request(result.status, self.overhead_ms)
            except Exception:
                self.x.observer_failed()
        return result

    def _in_flight(self) -> bool:
        return any(not task.done() for task in self.tasks.values())

    def _start_task(self, node: NodeSpec, document: Any) -> None:
        task = self.loop.create_task(node_call.call(self, node, document), name=f"raypipe:{node.name}")
        self.tasks[node.name] = task
        self.x.track(task)

    def _wake(self) -> None:
        """Lets the request's coroutine go on after a task settled something."""
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def remaining(self) -> float:
        """Seconds until the request deadline."""
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

    def fail(self, error: GraphError) -> None:
        """Answers the request with `error`, unless it is answered already."""
        if self.result is not None:
            return
        logger.info("raypipe: request failed: %s (node %s): %s", error.code, error.node, error.message)
        self._respond(Result(error.status, error.body(), error=error))

    def on_deadline(self) -> None:
        running = [n for n in self.g.order if self.state[n] == RUNNING and n not in self.g.shadow]
        waiting = f" while waiting for {', '.join(running)}" if running else ""
        self.fail(
            GraphError(
                "DEADLINE",
                running[0] if running else None,
                f"the request deadline of {self.g.deadline_ms} ms passed{waiting}",
            )
        )

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
        partial_nodes = partial(self.g, self.soft_failed, self.state, self.edge_live)
        if partial_nodes:
            h[HEADER_PARTIAL] = ",".join(partial_nodes)
        if self.fallbacks:
            h[HEADER_FALLBACK] = ",".join(self.fallbacks)
        if self.trace:
            h[HEADER_TRACE] = json.dumps(trace(self.g, self.state, self.info, self.reasons), separators=(",", ":"))
            h[HEADER_SERVER_TIMING] = server_timing(self.info, self.overhead_ms)
        return h

    def observe_outcome(self, name: str, outcome: str) -> None:
        observer = self.x.observer
        if observer is not None:
            try:
                observer.node_outcome(name, outcome)
            except Exception:
                self.x.observer_failed()

    # ---- the event loop of one request ------------------------------------------------------

    def settle(self, name: str, state: str, value: Any = None, reason: str | None = None) -> None:
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
                    self.fail(error)
                except Exception as exc:  # a bug here must not hang the request
                    logger.exception("raypipe: internal error while settling %s", item[0])
                    self.fail(
                        GraphError(
                            "INTERNAL", item[0], f"internal error of the graph runtime: {describe_exception(exc)}"
                        )
                    )
            if self.result is None and self.tasks and self.x.prunable:
                self._prune()
        finally:
            self.draining = False
        if self.ready or self.result is not None:
            self._wake()

    def _apply(self, name: str, state: str, value: Any, reason: str | None) -> None:
        prior = self.state[name]
        if prior in SETTLED:
            return
        self.state[name] = state
        if state == DONE:
            self.values[name] = value
        else:
            if reason:
                self.reasons[name] = reason
            if (
                state == SKIPPED
                and prior == PENDING
                and self.x.observer is not None
                and self.g.nodes[name].kind == "model"
            ):
                self.observe_outcome(name, OUTCOME_SKIPPED)  # never called
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
            self.fail(
                GraphError("OUTPUT_SKIPPED", out, f"the response could not be assembled: {self._skip_chain(out)}")
            )

    def _skip_chain(self, name: str) -> str:
        """Why a node was skipped, followed upstream to the first cause."""
        parts = []
        seen = set()
        while name not in seen:
            seen.add(name)
            reason = self.reasons.get(name, "skipped")
            parts.append(f"{name} ({reason})")
            dead = [
                e
                for e in self.g.in_edges[name]
                if not self.edge_live.get(e.index, True)
                and self.state[e.source] in (SKIPPED, FAILED)
                and not e.optional
            ]
            if not dead:
                dead = [e for e in self.g.in_edges[name] if self.state[e.source] in (SKIPPED, FAILED)]
            if not dead:
                break
            name = dead[0].source
        return " <- ".join(parts)

    def _scope(self, source: str) -> dict:
        state, values = self.state, self.values
        return {name: values[name] for name in self.x.scope_names[source] if state[name] == DONE}

    def _evaluate(self, predicate: Any, scope: dict, what: str, node: str) -> bool:
        try:
            return pred.evaluate(predicate, scope)
        except jp.RawBodyError as e:
            raise GraphError(
                "INVALID_INPUT", node, f"{what} reads {e.args[0]} but the request body is not JSON"
            ) from None

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
        self.settle(name, SKIPPED, reason=reason)

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
            if e.mode == "DATA" and e.optional and take(node, e, self.values, self.g.ingress) is DEAD:
                self.edge_live[e.index] = False
                return self._try_fire(name)
        if node.kind == "model" and not self._needed(name):
            return self._skip(name, "no longer needed")
        if name in self.g.shadow and node.shadow_percent is not None and node.shadow_percent < 100:
            if self.x.rng.random() * 100 >= node.shadow_percent:
                return self._skip(name, "not sampled")
        try:
            document = assemble(node, live, dead_optional, self.values, self.g.ingress)
        except GraphError as error:
            if error.code == "INVALID_INPUT" or node.kind != "model":
                raise
            return node_call.node_failed(self, node, Failure("INPUT", error.message, 0, code=error.code))
        if node.kind == "output":
            return self.settle(name, DONE, document)
        if node.kind == "switch":
            return self._route_switch(node, document)
        if node.kind == "split":
            return self._route_split(node, document)
        if node.kind == "model":
            self.state[name] = RUNNING
            if name in self.g.shadow:
                # Never awaited by the request: a task of its own, bounded by the deadline.
                task = self.loop.create_task(node_call.call_shadow(self, node, document), name=f"raypipe:{name}")
                self.x.track(task)
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
            raise GraphError(
                "NO_ROUTE", node.name, f"no case of switch {node.name} matched the request and it has no default"
            )
        self._choose(node.name, chosen)
        self.settle(node.name, DONE, document)

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
                raise GraphError(
                    "INVALID_INPUT",
                    node.name,
                    f"the sticky key {node.sticky_key} of split {node.name} reads a request body that is not JSON",
                ) from None
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
        self.settle(node.name, DONE, document)

    def _scope_with(self, name: str, value: Any) -> dict:
        scope = self._scope(name)
        scope[name] = value
        return scope

    def _choose(self, name: str, edge: EdgeSpec) -> None:
        self.chosen[name] = edge.index
        self.routes.append(f"{name}={edge.target}")

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
