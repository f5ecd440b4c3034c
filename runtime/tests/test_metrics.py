"""The executor's observer hook and its binding to metrics (metrics.py), without Ray: node
outcomes and call times per request, the graph overhead, the Server-Timing header, bounded tags,
and that a failing observer never fails a request."""

import asyncio
import logging

import pytest
from conftest import run
from test_engine import Recorder, graph, model

from raypipe_runtime import engine, metrics
from raypipe_runtime.engine import Executor
from raypipe_runtime.spec import parse_graph_text


class FakeObserver(engine.Observer):
    """Records what the executor reports; `clock` (when given) advances `step_s` on every
    outcome, standing for time the executor spends between node calls."""

    def __init__(self, clock=None, step_s=0.0):
        self.outcomes = []
        self.calls = []
        self.requests = []
        self.clock = clock
        self.step_s = step_s

    def node_outcome(self, node, outcome):
        self.outcomes.append((node, outcome))
        if self.clock is not None:
            self.clock.now += self.step_s

    def node_call(self, node, ms):
        self.calls.append((node, ms))

    def request(self, status, overhead_ms):
        self.requests.append((status, overhead_ms))


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def ticking(clock, name, seconds, result=None):
    """A node caller that takes `seconds` of the fake clock (and suspends once, as a call over
    a handle does)."""

    async def call(*args, **kwargs):
        await asyncio.sleep(0)
        clock.now += seconds
        return result if result is not None else name

    return call


def test_failure_outcomes_follow_the_node_and_its_on_error():
    def node(on_error):
        extra = {"fallback_value": 0} if on_error == "FALLBACK" else {}
        return graph([model("m", on_error=on_error, **extra)], [("request", "m"), ("m", "response")]).nodes["m"]

    assert engine.failure_outcome(node("FAIL"), "APP_ERROR", shadow=False) == "error"
    assert engine.failure_outcome(node("FAIL"), "UNAVAILABLE", shadow=False) == "error"
    assert engine.failure_outcome(node("FAIL"), "INPUT", shadow=False) == "error"
    assert engine.failure_outcome(node("FAIL"), "TIMEOUT", shadow=False) == "timeout"
    assert engine.failure_outcome(node("SKIP"), "APP_ERROR", shadow=False) == "error"
    assert engine.failure_outcome(node("SKIP"), "TIMEOUT", shadow=False) == "timeout"
    assert engine.failure_outcome(node("FALLBACK"), "TIMEOUT", shadow=False) == "fallback"
    assert engine.failure_outcome(node("FALLBACK"), "BACKPRESSURE", shadow=False) == "fallback"
    assert engine.failure_outcome(node("FAIL"), "TIMEOUT", shadow=True) == "shadow_failed"


def every_outcome_graph():
    """One node per outcome: main ok, soft error (skipped by on_error), slow timeout, fb
    fallback, shadow shadow_failed; the switch takes `left`, so `right` is skipped."""
    always = {"compare": {"path": "/request/x", "op": "EQ", "value": 1}}
    return graph(
        [
            model("main"),
            model("soft", on_error="SKIP"),
            model("slow", timeout_ms=50, on_error="SKIP"),
            model("fb", on_error="FALLBACK", fallback_value=0),
            model("shadow", shadow={}),
            {"name": "s", "switch": {}},
            model("left"),
            model("right"),
        ],
        [
            ("request", "main"),
            ("request", "soft"),
            ("request", "slow"),
            ("request", "fb"),
            ("request", "shadow"),
            ("request", "s"),
            {"source": "s", "target": "left", "when": always},
            {"source": "s", "target": "right"},
            {"source": "main", "target": "response", "into": "/main"},
            {"source": "soft", "target": "response", "into": "/soft", "optional": True},
            {"source": "slow", "target": "response", "into": "/slow", "optional": True},
            {"source": "fb", "target": "response", "into": "/fb"},
            {"source": "left", "target": "response", "into": "/left", "optional": True},
            {"source": "right", "target": "response", "into": "/right", "optional": True},
        ],
    )


def test_every_model_node_reports_one_outcome_per_request():
    rec = Recorder()
    observer = FakeObserver()
    ex = Executor(
        every_outcome_graph(),
        {
            "main": rec.fn("main", 1),
            "soft": rec.fn("soft", fail=RuntimeError("soft boom")),
            "slow": rec.fn("slow", 2, delay=5),
            "fb": rec.fn("fb", fail=RuntimeError("fb boom")),
            "shadow": rec.fn("shadow", fail=RuntimeError("shadow boom")),
            "left": rec.fn("left", 3),
            "right": rec.fn("right", 4),
        },
        observer=observer,
    )

    async def scenario():
        result = await ex.run({"x": 1})
        await ex.wait_idle(5)
        return result

    result = run(scenario())
    assert (result.status, result.body) == (200, {"main": 1, "fb": 0, "left": 3})
    assert sorted(observer.outcomes) == sorted(
        [
            ("main", "ok"),
            ("soft", "error"),
            ("slow", "timeout"),
            ("fb", "fallback"),
            ("shadow", "shadow_failed"),
            ("left", "ok"),
            ("right", "skipped"),
        ]
    )
    assert sorted(name for name, _ in observer.calls) == ["fb", "left", "main", "shadow", "slow", "soft"]
    slow_ms = next(ms for name, ms in observer.calls if name == "slow")
    assert 45 <= slow_ms < 1000, slow_ms
    assert len(observer.requests) == 1 and observer.requests[0][0] == 200


def test_a_failed_request_counts_the_failing_node_and_not_the_nodes_it_never_reached():
    g = graph([model("a"), model("b")], [("request", "a"), ("a", "b"), ("b", "response")])
    observer = FakeObserver()
    ex = Executor(
        g, {"a": Recorder().fn("a", fail=RuntimeError("boom")), "b": Recorder().fn("b", 1)}, observer=observer
    )
    assert run(ex.run({})).status == 502
    assert observer.outcomes == [("a", "error")]
    assert [status for status, _ in observer.requests] == [502]


def test_the_deadline_is_a_timeout_and_a_lost_race_is_skipped_untimed():
    deadline = graph([model("a")], [("request", "a"), ("a", "response")], deadline_ms=50)
    observer = FakeObserver()
    ex = Executor(deadline, {"a": Recorder().fn("a", 1, delay=5)}, observer=observer)
    assert run(ex.run({})).status == 504
    assert observer.outcomes == [("a", "timeout")]
    assert [name for name, _ in observer.calls] == ["a"]
    assert [status for status, _ in observer.requests] == [504]

    race = graph(
        [model("fast"), model("slow")],
        [("request", "fast"), ("request", "slow"), ("fast", "response"), ("slow", "response")],
        output={"join": "ANY"},
    )
    observer = FakeObserver()
    # fast suspends, as a call over a handle does, so slow's call has started when it is cut.
    ex = Executor(
        race,
        {"fast": Recorder().fn("fast", 1, delay=0.01), "slow": Recorder().fn("slow", 2, delay=5)},
        observer=observer,
    )
    assert run(ex.run({})).body == 1
    assert sorted(observer.outcomes) == [("fast", "ok"), ("slow", "skipped")]
    assert [name for name, _ in observer.calls] == ["fast"]


def test_overhead_is_wall_time_outside_node_calls_with_overlapping_calls_counted_once():
    clock = FakeClock()
    # Fan-out: a and b start together; the fake clock moves only when told, so b's call spans
    # a's 10 ms, the 1 ms the executor spends on a's outcome and its own 30 ms (41 ms); then c
    # takes 20 ms. The calls sum to 71 ms but cover 61 ms; each outcome costs the executor 1 ms.
    g = graph(
        [model("a"), model("b"), model("c")],
        [
            ("request", "a"),
            ("request", "b"),
            {"source": "a", "target": "c", "into": "/a"},
            {"source": "b", "target": "c", "into": "/b"},
            ("c", "response"),
        ],
    )
    observer = FakeObserver(clock, step_s=0.001)
    ex = Executor(
        g,
        {"a": ticking(clock, "a", 0.010), "b": ticking(clock, "b", 0.030), "c": ticking(clock, "c", 0.020)},
        clock=clock,
        observer=observer,
    )
    started = clock.now
    result = run(ex.run({}, {"x-raypipe-trace": "1"}))
    wall_ms = (clock.now - started) * 1000
    assert result.status == 200
    ((_status, overhead_ms),) = observer.requests
    # a's outcome (1 ms) overlaps b's call; b's and c's outcomes are the executor's own time.
    assert overhead_ms == pytest.approx(2.0, abs=1e-6)
    assert dict(observer.calls)["b"] == pytest.approx(41.0, abs=1e-6)
    assert wall_ms == pytest.approx(63.0, abs=1e-6)
    timing = result.headers["server-timing"]
    assert timing.startswith("a;dur=10.0, b;dur=41.0, c;dur=20.0"), timing
    assert timing.endswith("_overhead;dur=2.0"), timing


def test_no_observer_and_no_trace_adds_no_timing_header():
    g = graph([model("a")], [("request", "a"), ("a", "response")])
    result = run(Executor(g, {"a": Recorder().fn("a", 1)}).run({}))
    assert "server-timing" not in result.headers and "x-raypipe-trace" not in result.headers


class Broken(engine.Observer):
    def node_outcome(self, node, outcome):
        raise RuntimeError("metrics backend down")

    def request(self, status, overhead_ms):
        raise RuntimeError("metrics backend down")


def test_a_failing_observer_never_fails_a_request_and_is_logged_once(caplog):
    g = graph(
        [model("a"), model("b", on_error="FALLBACK", fallback_value=7)],
        [("request", "a"), ("a", "b"), ("b", "response")],
    )
    ex = Executor(g, {"a": Recorder().fn("a", 1), "b": Recorder().fn("b", fail=RuntimeError("x"))}, observer=Broken())
    with caplog.at_level(logging.ERROR, logger="raypipe_runtime"):
        answers = [run(ex.run({})) for _ in range(3)]
    assert [(r.status, r.body) for r in answers] == [(200, 7)] * 3
    failures = [r for r in caplog.records if "metrics observer failed" in r.getMessage()]
    assert len(failures) == 1


# ---- the binding to metrics ------------------------------------------------------------------


class FakeMetric:
    def __init__(self, kind, name, tag_keys, boundaries=None):
        self.kind, self.name, self.tag_keys, self.boundaries = kind, name, tag_keys, boundaries
        self.defaults = {}
        self.records = []

    def set_default_tags(self, tags):
        assert set(tags) <= set(self.tag_keys), (self.name, tags)
        self.defaults = dict(tags)

    def _record(self, value, tags):
        final = {**self.defaults, **(tags or {})}
        assert set(final) == set(self.tag_keys), (self.name, final)  # what Ray insists on too
        self.records.append((value, final))

    def inc(self, value=1, tags=None):
        self._record(value, tags)

    def observe(self, value, tags=None):
        self._record(value, tags)


class FakeRegistry:
    def __init__(self):
        self.metrics = {}

    def counter(self, name, description, tag_keys):
        self.metrics[name] = FakeMetric("counter", name, tag_keys)
        return self.metrics[name]

    def histogram(self, name, description, boundaries, tag_keys):
        self.metrics[name] = FakeMetric("histogram", name, tag_keys, boundaries)
        return self.metrics[name]


def labelled_graph(labels):
    return parse_graph_text(
        {
            "name": "pipe",
            "version": "v7",
            "ingress": "request",
            "labels": labels,
            "nodes": [
                {"name": "request", "input": {}},
                model("a"),
                model("b", on_error="SKIP"),
                {"name": "response", "output": {}},
            ],
            "edges": [
                {"source": "request", "target": "a"},
                {"source": "request", "target": "b"},
                {"source": "a", "target": "response", "into": "/a"},
                {"source": "b", "target": "response", "into": "/b", "optional": True},
            ],
        }
    )


def test_the_metrics_carry_graph_version_node_outcome_and_bounded_labels():
    registry = FakeRegistry()
    labels = {"team": "search", "tier": "x" * 100, "cost.center": "42", "a": "1", "b": "2", "z-last": "dropped"}
    observer = metrics.MetricsObserver(labelled_graph(labels), registry.counter, registry.histogram)
    ex = Executor(
        labelled_graph(labels),
        {"a": Recorder().fn("a", 1), "b": Recorder().fn("b", fail=ValueError())},
        observer=observer,
    )
    for _ in range(2):
        assert run(ex.run({})).status == 200
    requests = registry.metrics["raypipe_node_requests"]
    assert requests.records == []  # counts wait for the flush
    observer.flush()

    graph_tags = {
        "graph": "pipe",
        "version": "v7",
        "label_a": "1",
        "label_b": "2",
        "label_cost_center": "42",
        "label_team": "search",
        "label_tier": "x" * 64,
    }
    assert requests.kind == "counter"
    assert sorted((v, t["node"], t["outcome"]) for v, t in requests.records) == [(2, "a", "ok"), (2, "b", "error")]
    assert all({k: t[k] for k in graph_tags} == graph_tags for _, t in requests.records)
    latency = registry.metrics["raypipe_node_latency_ms"]
    assert sorted(t["node"] for _, t in latency.records) == ["a", "a", "b", "b"]
    assert latency.boundaries == metrics.LATENCY_BOUNDS_MS
    overhead = registry.metrics["raypipe_graph_overhead_ms"]
    assert len(overhead.records) == 2 and all(t == graph_tags for _, t in overhead.records)
    assert all(v >= 0 for v, _ in overhead.records)
    graph_requests = registry.metrics["raypipe_graph_requests"]
    assert [(v, t["status_class"]) for v, t in graph_requests.records] == [(2, "2xx")]


def test_counts_reach_the_counters_on_a_timer_and_a_failing_flush_is_logged_once(caplog):
    registry = FakeRegistry()
    observer = metrics.MetricsObserver(labelled_graph({}), registry.counter, registry.histogram, flush_interval_s=0.05)

    async def scenario():
        observer.node_outcome("a", "ok")
        observer.request(504, 1.0)
        observer.node_outcome("a", "ok")
        await asyncio.sleep(0.2)

    run(scenario())
    requests = registry.metrics["raypipe_node_requests"]
    assert [(v, t["node"], t["outcome"]) for v, t in requests.records] == [(2, "a", "ok")]
    assert [(v, t["status_class"]) for v, t in registry.metrics["raypipe_graph_requests"].records] == [(1, "5xx")]

    def refuse(value=1, tags=None):
        raise RuntimeError("metrics backend down")

    requests.inc = refuse
    with caplog.at_level(logging.ERROR, logger="raypipe_runtime"):
        for _ in range(2):
            observer.node_outcome("b", "error")
            observer.flush()
    assert len([r for r in caplog.records if "adding counts" in r.getMessage()]) == 1
    with pytest.raises(ValueError):
        observer.node_outcome("not-a-node", "ok")


def test_label_tags_are_few_short_and_valid_names():
    tags = metrics.label_tags({f"k{i}": "v" for i in range(20)} | {"über/key": "é" * 70})
    assert len(tags) == metrics.MAX_LABELS
    assert all(k.startswith("label_") and k.replace("_", "").isalnum() and k.isascii() for k in tags)
    assert metrics.label_tags({"a.b": "first", "a_b": "second"}) == {"label_a_b": "first"}
    assert metrics.label_tags({"x": "é" * 70}) == {"label_x": "é" * 64}
    assert metrics.label_tags({}) == {}


def test_status_classes():
    assert [metrics.status_class(s) for s in (200, 204, 400, 422, 502, 504, 99, 600)] == [
        "2xx",
        "2xx",
        "4xx",
        "4xx",
        "5xx",
        "5xx",
        "other",
        "other",
    ]


def test_metrics_that_cannot_be_made_leave_the_graph_without_an_observer(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise ValueError("no metrics here")

    monkeypatch.setattr(metrics.MetricsObserver, "__init__", refuse)
    with caplog.at_level(logging.ERROR, logger="raypipe_runtime"):
        assert metrics.ray_observer(labelled_graph({})) is None
    assert any("runs without them" in r.getMessage() for r in caplog.records)
