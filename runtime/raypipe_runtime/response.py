"""What the executor answers: the `Result` and what its raypipe headers say about the request
(the graph, routes taken, partial and fallback nodes, the trace and its Server-Timing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import GraphError
from .spec import GraphSpec
from .states import DONE, PENDING

HEADER_ROUTE = "x-raypipe-route"
HEADER_PARTIAL = "x-raypipe-partial"
HEADER_FALLBACK = "x-raypipe-fallback"
HEADER_GRAPH = "x-raypipe-graph"
HEADER_TRACE = "x-raypipe-trace"
HEADER_RETRY_AFTER = "retry-after"
HEADER_SERVER_TIMING = "server-timing"


@dataclass
class Result:
    """What the executor answers: an HTTP status, a JSON-able body and response headers."""

    status: int
    body: Any
    headers: dict = field(default_factory=dict)
    error: GraphError | None = None


def partial(
    graph: GraphSpec, soft_failed: list[str], state: Mapping[str, str], edge_live: Mapping[int, bool]
) -> list[str]:
    """The nodes `x-raypipe-partial` names: soft-failed nodes, then the sources of the OUTPUT
    node's dead optional in-edges."""
    names = list(soft_failed)
    out = graph.output
    if out and state.get(out) == DONE and graph.nodes[out].join == "ALL":
        for e in graph.in_edges[out]:
            if e.optional and not edge_live.get(e.index, False) and e.source not in names:
                names.append(e.source)
    return names


def trace(graph: GraphSpec, state: Mapping[str, str], info: Mapping[str, dict], reasons: Mapping[str, str]) -> dict:
    """`x-raypipe-trace`: each node the request reached, its state, attempts, time and reason."""
    return {
        name: {"state": state[name], **info.get(name, {}), **({"reason": reasons[name]} if name in reasons else {})}
        for name in graph.order
        if state[name] != PENDING or name in info
    }


def server_timing(info: Mapping[str, dict], overhead_ms: float) -> str:
    """W3C Server-Timing: each node call finished so far, then the graph overhead as
    `_overhead` (node names start with a letter or digit, so it names no node)."""
    parts = [f"{name};dur={node_info['ms']}" for name, node_info in info.items() if "ms" in node_info]
    parts.append(f"_overhead;dur={round(overhead_ms, 3)}")
    return ", ".join(parts)
