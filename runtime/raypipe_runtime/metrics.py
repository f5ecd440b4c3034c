"""Per-node and per-graph metrics of the graph runtime, through Ray Serve's own metrics API.

`MetricsObserver` is the engine's `Observer` (engine.py) bound to `ray.serve.metrics` Counters
and Histograms, which Ray's metrics agent exports on each node's metrics port (Prometheus text,
with Ray's `ray_` prefix and Serve's `deployment`, `replica` and `application` tags), so the
scraping users already run for Ray carries them:

- `raypipe_node_requests` (exported `ray_raypipe_node_requests_total`), tags graph, version,
  node, outcome (engine.OUTCOMES) and the graph's labels;
- `raypipe_node_latency_ms`: a node's call time, retries included, tags graph, version, node;
- `raypipe_graph_overhead_ms`: per answered request, the time the executor added on top of its
  node calls (defined in engine.Observer);
- `raypipe_graph_requests` (exported `ray_raypipe_graph_requests_total`), tags graph, version,
  status_class (2xx, 4xx, 5xx).

Counters are summed in the replica and added to Ray's every FLUSH_INTERVAL_S (a record of Ray's
costs some microseconds, a dict increment a fraction of one; Ray itself exports every few
seconds); histograms are recorded at once, as Ray has no way to add several samples in one call.

Cardinality is bounded by the graph alone, never by requests: node names and outcomes come
from the graph and engine.OUTCOMES, and at most MAX_LABELS of the graph's labels become tags
(`label_<key>`, the first in key order; values cut to MAX_LABEL_VALUE characters). Metrics never
break a request: building them failing leaves the executor without an observer (logged), the
engine logs a failing record once and goes on, and so does a failing flush.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable

from . import engine
from .spec import GraphSpec

logger = logging.getLogger("raypipe_runtime")

MAX_LABELS = 5
MAX_LABEL_VALUE = 64
LABEL_PREFIX = "label_"

NODE_REQUESTS = "raypipe_node_requests"
NODE_LATENCY = "raypipe_node_latency_ms"
GRAPH_OVERHEAD = "raypipe_graph_overhead_ms"
GRAPH_REQUESTS = "raypipe_graph_requests"

# Node calls: from a cached lookup to a slow generative model.
LATENCY_BOUNDS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)
# The graph's own work per request is usually well under a millisecond.
OVERHEAD_BOUNDS_MS = (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 500)
FLUSH_INTERVAL_S = 1.0

_NOT_A_LABEL_CHAR = re.compile(r"[^A-Za-z0-9_]")


def label_tags(labels: dict) -> dict:
    """The graph's labels as metric tags: at most MAX_LABELS, `label_<key>` with every character
    a Prometheus label name cannot hold made `_`, values cut to MAX_LABEL_VALUE characters. Keys
    that become the same tag keep the first in key order."""
    tags: dict[str, str] = {}
    for key in sorted(labels):
        if len(tags) >= MAX_LABELS:
            break
        tag = LABEL_PREFIX + _NOT_A_LABEL_CHAR.sub("_", key)
        if tag not in tags:
            tags[tag] = str(labels[key])[:MAX_LABEL_VALUE]
    return tags


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status <= 599 else "other"


class MetricsObserver(engine.Observer):
    """engine.Observer recording into four metrics made by `counter(name, description,
    tag_keys)` and `histogram(name, description, boundaries, tag_keys)`: objects with
    `set_default_tags(dict)` and `inc(value, tags)` / `observe(value, tags)`, as Ray's are.
    Counts wait for `flush()`, which a timer on the recording loop runs FLUSH_INTERVAL_S after
    the first count that found nothing pending."""

    def __init__(
        self, graph: GraphSpec, counter: Callable, histogram: Callable, flush_interval_s: float = FLUSH_INTERVAL_S
    ):
        graph_tags = {"graph": graph.name, "version": graph.version, **label_tags(graph.labels)}
        keys = tuple(graph_tags)
        self._node_requests = counter(
            NODE_REQUESTS, "Model node outcomes per request, by node and outcome.", (*keys, "node", "outcome")
        )
        self._node_latency = histogram(
            NODE_LATENCY, "Time of a model node's calls in ms, retries included.", LATENCY_BOUNDS_MS, (*keys, "node")
        )
        self._overhead = histogram(
            GRAPH_OVERHEAD,
            "Time per request the graph executor added on top of its node calls, in ms.",
            OVERHEAD_BOUNDS_MS,
            keys,
        )
        self._graph_requests = counter(
            GRAPH_REQUESTS, "Requests the graph answered, by status class.", (*keys, "status_class")
        )
        for metric in (self._node_requests, self._node_latency, self._overhead, self._graph_requests):
            metric.set_default_tags(dict(graph_tags))
        # Tag dicts made once: a record then costs no formatting.
        names = [node.name for node in graph.model_nodes()]
        self._outcome_tags = {
            (name, outcome): {"node": name, "outcome": outcome} for name in names for outcome in engine.OUTCOMES
        }
        self._node_tags = {name: {"node": name} for name in names}
        self._status_tags: dict[int, dict[str, str]] = {}
        self._flush_interval_s = flush_interval_s
        self._outcome_counts: dict = {}  # (node, outcome) -> count not yet added to Ray's
        self._status_counts: dict = {}  # status -> count not yet added to Ray's
        self._flush_pending = False
        self._flush_failed = False

    def node_outcome(self, node: str, outcome: str) -> None:
        key = (node, outcome)
        if key not in self._outcome_tags:
            raise ValueError(f"no metric tags for node {node!r} and outcome {outcome!r}")
        counts = self._outcome_counts
        counts[key] = counts.get(key, 0) + 1
        if not self._flush_pending:
            self._schedule_flush()

    def node_call(self, node: str, ms: float) -> None:
        self._node_latency.observe(ms, self._node_tags[node])

    def request(self, status: int, overhead_ms: float) -> None:
        if status not in self._status_tags:
            self._status_tags[status] = {"status_class": status_class(status)}
        counts = self._status_counts
        counts[status] = counts.get(status, 0) + 1
        if not self._flush_pending:
            self._schedule_flush()
        self._overhead.observe(overhead_ms, None)

    def _schedule_flush(self) -> None:
        self._flush_pending = True
        try:
            asyncio.get_running_loop().call_later(self._flush_interval_s, self.flush)
        except RuntimeError:  # no running loop: nothing would run a timer
            self.flush()

    def flush(self) -> None:
        """Adds the pending counts to the counters; a failure is logged once and the counts
        are dropped (metrics never hold memory or a request hostage)."""
        self._flush_pending = False
        outcomes, self._outcome_counts = self._outcome_counts, {}
        statuses, self._status_counts = self._status_counts, {}
        try:
            for key, n in outcomes.items():
                self._node_requests.inc(n, self._outcome_tags[key])
            for status, n in statuses.items():
                self._graph_requests.inc(n, self._status_tags[status])
        except Exception:
            if not self._flush_failed:
                self._flush_failed = True
                logger.exception("raypipe: adding counts to the metrics failed; such failures are not logged again")


def ray_observer(graph: GraphSpec) -> MetricsObserver | None:
    """The observer over `ray.serve.metrics`, or None (logged) when they cannot be made: the
    graph then runs without metrics rather than not at all."""
    try:
        from ray.serve import metrics as serve_metrics

        def histogram(name, description, boundaries, tag_keys):
            return serve_metrics.Histogram(name, description, list(boundaries), tag_keys)

        return MetricsObserver(graph, serve_metrics.Counter, histogram)
    except Exception:
        logger.exception("raypipe: cannot create the graph's metrics; it runs without them")
        return None
