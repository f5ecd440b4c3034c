"""Executor semantics with plain async callables (no Ray): concurrency, joins, switch, split,
shadow, timeouts, deadline, retries, errors, input assembly, headers, cancellation."""

import asyncio
import random
import time

import pytest
from conftest import run

from raypipe_runtime import engine, timeouts
from raypipe_runtime.engine import Backpressure, Executor, Unavailable
from raypipe_runtime.pointer import RawBody
from raypipe_runtime.spec import parse_graph_text


def model(name, **extra):
    return {"name": name, "model": {"import_path": f"tests.models:{name}"}, **extra}


def graph(nodes, edges, output=None, **top):
    text = {
        "name": "t",
        "version": "3",
        "ingress": "request",
        "nodes": [{"name": "request", "input": {}}, *nodes, {"name": "response", "output": {}, **(output or {})}],
        "edges": [dict(zip(("source", "target"), e, strict=False)) if isinstance(e, tuple) else e for e in edges],
        **top,
    }
    return parse_graph_text(text)


class Recorder:
    """Callables that record calls, in-flight counts and cancellations."""

    def __init__(self):
        self.calls = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.cancelled = []

    def fn(self, name, result=None, delay=0.0, fail=None):
        async def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if delay:
                    await asyncio.sleep(delay)
                if fail is not None:
                    raise fail
                return result(*args, **kwargs) if callable(result) else result
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise
            finally:
                self.in_flight -= 1

        return call

    def names(self):
        return [c[0] for c in self.calls]


def echo(tag):
    return lambda doc=None, **kw: {"by": tag, "got": doc if not kw else kw}


# ---- patterns ------------------------------------------------------------------------------


def test_sequence_passes_values_whole():
    g = graph([model("a"), model("b")], [("request", "a"), ("a", "b"), ("b", "response")])
    rec = Recorder()
    ex = Executor(g, {"a": rec.fn("a", lambda d: d["x"] + 1), "b": rec.fn("b", lambda d: d * 10)})
    result = run(ex.run({"x": 1}))
    assert (result.status, result.body) == (200, 20)
    assert result.headers["x-raypipe-graph"] == "t@3"


def test_fan_out_runs_branches_concurrently_and_fans_in_by_key():
    g = graph(
        [model("a"), model("b"), model("c")],
        [
            ("request", "a"),
            ("request", "b"),
            {"source": "a", "target": "c", "into": "/left"},
            {"source": "b", "target": "c", "into": "/right/value"},
            ("c", "response"),
        ],
    )
    rec = Recorder()
    ex = Executor(g, {"a": rec.fn("a", 1, delay=0.3), "b": rec.fn("b", 2, delay=0.3), "c": rec.fn("c", lambda d: d)})
    started = time.monotonic()
    result = run(ex.run({}))
    elapsed = time.monotonic() - started
    assert result.body == {"left": 1, "right": {"value": 2}}
    assert rec.max_in_flight == 2
    assert elapsed < 0.55, f"branches ran one after the other ({elapsed:.2f}s)"


def test_switch_takes_the_first_matching_case_by_order_then_the_default():
    g = graph(
        [{"name": "s", "switch": {}}, model("low"), model("high"), model("other")],
        [
            ("request", "s"),
            {
                "source": "s",
                "target": "high",
                "order": 1,
                "when": {"compare": {"path": "/request/n", "op": "GT", "value": 10}},
            },
            {
                "source": "s",
                "target": "low",
                "order": 0,
                "when": {"compare": {"path": "/request/n", "op": "GT", "value": 0}},
            },
            {"source": "s", "target": "other"},
            ("low", "response"),
            ("high", "response"),
            ("other", "response"),
        ],
        output={"join": "ANY"},
    )
    ex = Executor(g, {n: Recorder().fn(n, n) for n in ("low", "high", "other")})
    assert run(ex.run({"n": 50})).body == "low"  # order 0 is tried first
    assert run(ex.run({"n": -1})).body == "other"
    result = run(ex.run({"n": 5}))
    assert result.headers["x-raypipe-route"] == "s=low"


def test_switch_without_a_match_fails_with_no_route_or_skips():
    nodes = [{"name": "s", "switch": {"on_no_match": "ERROR"}}, model("m")]
    edges = [
        ("request", "s"),
        {"source": "s", "target": "m", "when": {"compare": {"path": "/request/go", "op": "TRUTHY"}}},
        ("m", "response"),
    ]
    ex = Executor(graph(nodes, edges), {"m": Recorder().fn("m", 1)})
    result = run(ex.run({"go": False}))
    assert result.status == 422
    assert result.body["error"]["code"] == "NO_ROUTE"
    assert result.body["error"]["node"] == "s"

    nodes[0] = {"name": "s", "switch": {"on_no_match": "SKIP"}}
    ex = Executor(graph(nodes, edges), {"m": Recorder().fn("m", 1)})
    result = run(ex.run({"go": False}))
    assert result.status == 422
    assert result.body["error"]["code"] == "OUTPUT_SKIPPED"
    assert "m (" in result.body["error"]["message"] and "s (no case matched)" in result.body["error"]["message"]


def split_graph(sticky=""):
    return graph(
        [{"name": "sp", "split": {"sticky_key": sticky} if sticky else {}}, model("a"), model("b"), model("c")],
        [
            ("request", "sp"),
            {"source": "sp", "target": "a", "weight": 3},
            {"source": "sp", "target": "b", "weight": 1},
            {"source": "sp", "target": "c", "weight": 0},
            ("a", "response"),
            ("b", "response"),
            ("c", "response"),
        ],
        output={"join": "ANY"},
    )


def test_split_follows_relative_weights_and_never_takes_a_drained_branch():
    ex = Executor(split_graph(), {n: Recorder().fn(n, n) for n in "abc"}, rng=random.Random(1))

    async def many():
        return [(await ex.run({})).body for _ in range(2000)]

    answers = run(many())
    assert answers.count("c") == 0
    share = answers.count("a") / len(answers)
    assert 0.71 < share < 0.79, share


def test_sticky_split_keeps_a_caller_on_one_branch():
    ex = Executor(split_graph("/request/user"), {n: Recorder().fn(n, n) for n in "abc"}, rng=random.Random(2))

    async def answers(user):
        return {(await ex.run({"user": user})).body for _ in range(20)}

    for user in ("alice", "bob", "carol", 17, {"id": 3}):
        assert len(run(answers(user))) == 1
    # Without the key the choice is random again.
    seen = set()
    for _ in range(60):
        seen.add(run(ex.run({})).body)
    assert seen == {"a", "b"}


def test_shadow_never_delays_or_breaks_the_response():
    g = graph(
        [model("main"), model("shadow", shadow={}), model("after_shadow")],
        [("request", "main"), ("main", "response"), ("request", "shadow"), ("shadow", "after_shadow")],
    )
    rec = Recorder()
    ex = Executor(
        g,
        {
            "main": rec.fn("main", "ok"),
            "shadow": rec.fn("shadow", "seen", delay=0.3),
            "after_shadow": rec.fn("after_shadow", None, fail=RuntimeError("shadow boom")),
        },
    )

    async def scenario():
        started = time.monotonic()
        result = await ex.run({})
        answered = time.monotonic() - started
        await ex.wait_idle(5)
        return result, answered

    result, answered = run(scenario())
    assert (result.status, result.body) == (200, "ok")
    assert answered < 0.2
    assert rec.names() == ["main", "shadow", "after_shadow"]  # the shadow branch did run, later


def test_shadow_sampling():
    g = graph(
        [model("main"), model("shadow", shadow={"sample_percent": 10})],
        [("request", "main"), ("main", "response"), ("request", "shadow")],
    )
    rec = Recorder()
    ex = Executor(g, {"main": rec.fn("main", 1), "shadow": rec.fn("shadow", 2)}, rng=random.Random(3))

    async def many():
        for _ in range(1000):
            await ex.run({})
        await ex.wait_idle(5)

    run(many())
    sampled = rec.names().count("shadow")
    assert 60 < sampled < 140, sampled


# ---- joins ---------------------------------------------------------------------------------


def test_join_all_runs_without_a_dead_optional_edge_and_reports_it():
    g = graph(
        [model("a"), model("b", on_error="SKIP"), model("c")],
        [
            ("request", "a"),
            ("request", "b"),
            {"source": "a", "target": "c", "into": "/a"},
            {"source": "b", "target": "c", "into": "/b", "optional": True, "if_missing": "none"},
            ("c", "response"),
        ],
    )
    rec = Recorder()
    ex = Executor(
        g, {"a": rec.fn("a", 1), "b": rec.fn("b", 2, fail=ValueError("bad b")), "c": rec.fn("c", lambda d: d)}
    )
    result = run(ex.run({}))
    assert result.status == 200
    assert result.body == {"a": 1, "b": "none"}
    assert result.headers["x-raypipe-partial"] == "b"


def test_join_all_is_skipped_without_hanging_when_a_required_edge_dies():
    g = graph(
        [model("a"), model("b", on_error="SKIP"), model("c")],
        [
            ("request", "a"),
            ("request", "b"),
            {"source": "a", "target": "c", "into": "/a"},
            {"source": "b", "target": "c", "into": "/b"},
            ("c", "response"),
        ],
    )
    rec = Recorder()
    ex = Executor(g, {"a": rec.fn("a", 1, delay=5), "b": rec.fn("b", 2, fail=ValueError("bad b")), "c": rec.fn("c", 3)})
    started = time.monotonic()
    result = run(ex.run({}))
    assert time.monotonic() - started < 1, "the join waited for a branch it no longer needs"
    assert result.status == 422
    assert result.body["error"]["code"] == "OUTPUT_SKIPPED"
    assert "b (failed: ValueError: bad b)" in result.body["error"]["message"]
    assert "c" not in rec.names()
    assert rec.cancelled == ["a"]  # no remaining consumer needed it


def test_join_any_takes_the_first_and_cancels_the_loser():
    g = graph(
        [model("fast"), model("slow")],
        [("request", "fast"), ("request", "slow"), ("fast", "response"), ("slow", "response")],
        output={"join": "ANY"},
    )
    rec = Recorder()
    ex = Executor(g, {"fast": rec.fn("fast", "fast", delay=0.05), "slow": rec.fn("slow", "slow", delay=5)})

    async def scenario():
        result = await ex.run({})
        await asyncio.sleep(0.05)
        return result

    result = run(scenario())
    assert result.body == "fast"
    assert rec.cancelled == ["slow"]


def test_guarded_edge_and_order_edge():
    g = graph(
        [model("first"), model("gated")],
        [
            ("request", "first"),
            {"source": "first", "target": "gated", "mode": "ORDER"},
            {
                "source": "request",
                "target": "gated",
                "when": {"compare": {"path": "/request/ok", "op": "EQ", "value": True}},
            },
            ("gated", "response"),
        ],
    )
    rec = Recorder()
    ex = Executor(g, {"first": rec.fn("first", "ignored", delay=0.05), "gated": rec.fn("gated", lambda d: d)})
    result = run(ex.run({"ok": True}))
    assert result.body == {"ok": True}  # the ORDER edge carries nothing
    assert rec.names() == ["first", "gated"]
    result = run(ex.run({"ok": False}))
    assert result.status == 422 and result.body["error"]["code"] == "OUTPUT_SKIPPED"


# ---- timeouts, deadline, retries --------------------------------------------------------------


def test_node_timeout_names_the_node():
    g = graph([model("slow", timeout_ms=50)], [("request", "slow"), ("slow", "response")])
    rec = Recorder()
    ex = Executor(g, {"slow": rec.fn("slow", 1, delay=5)})
    result = run(ex.run({}))
    assert result.status == 504
    assert result.body["error"] == {
        "code": "TIMEOUT",
        "node": "slow",
        "message": "slow: attempt 1 timed out after 50 ms",
        "attempts": 1,
    }
    assert rec.cancelled == ["slow"]


def test_timeout_of_a_soft_node_only_skips_it():
    g = graph(
        [model("main"), model("extra", timeout_ms=50, on_error="SKIP")],
        [
            ("request", "main"),
            ("request", "extra"),
            {"source": "main", "target": "response", "into": "/main"},
            {"source": "extra", "target": "response", "into": "/extra", "optional": True},
        ],
    )
    ex = Executor(g, {"main": Recorder().fn("main", 1), "extra": Recorder().fn("extra", 2, delay=5)})
    result = run(ex.run({}))
    assert (result.status, result.body, result.headers["x-raypipe-partial"]) == (200, {"main": 1}, "extra")


def test_the_request_deadline_bounds_every_call():
    g = graph([model("a"), model("b")], [("request", "a"), ("a", "b"), ("b", "response")], deadline_ms=200)
    rec = Recorder()
    ex = Executor(g, {"a": rec.fn("a", 1, delay=0.15), "b": rec.fn("b", 2, delay=5)})
    started = time.monotonic()
    result = run(ex.run({}))
    elapsed = time.monotonic() - started
    assert result.status == 504
    assert result.body["error"]["code"] == "DEADLINE"
    assert result.body["error"]["node"] == "b"
    assert 0.18 < elapsed < 0.5
    assert rec.cancelled == ["b"]


def test_retries_the_listed_classes_with_backoff():
    attempts = []

    async def flaky(doc):
        attempts.append(doc)
        if len(attempts) < 3:
            raise Unavailable("replica died")
        return "finally"

    sleeps = []

    async def fake_sleep(seconds):
        sleeps.append(seconds)

    g = graph(
        [
            model(
                "m",
                retry={"attempts": 3, "initial_backoff_ms": 100, "max_backoff_ms": 150, "retry_on": ["UNAVAILABLE"]},
            )
        ],
        [("request", "m"), ("m", "response")],
    )
    ex = Executor(g, {"m": flaky}, sleep=fake_sleep, rng=random.Random(4))
    result = run(ex.run({"x": 1}, {"x-raypipe-trace": "1"}))
    assert (result.status, result.body) == (200, "finally")
    assert len(attempts) == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 0.1 and 0 <= sleeps[1] <= 0.15
    assert '"attempts":3' in result.headers["x-raypipe-trace"]


def test_app_errors_are_not_retried_unless_opted_in():
    calls = []

    async def broken(doc):
        calls.append(1)
        raise KeyError("model weights")

    g = graph(
        [model("m", retry={"attempts": 4, "retry_on": ["UNAVAILABLE", "TIMEOUT"]})],
        [("request", "m"), ("m", "response")],
    )
    result = run(Executor(g, {"m": broken}).run({}))
    assert len(calls) == 1
    assert result.status == 502
    assert result.body["error"]["attempts"] == 1

    calls.clear()
    g = graph(
        [model("m", retry={"attempts": 4, "initial_backoff_ms": 1, "max_backoff_ms": 2, "retry_on": ["APP_ERROR"]})],
        [("request", "m"), ("m", "response")],
    )
    result = run(Executor(g, {"m": broken}).run({}))
    assert len(calls) == 4
    assert result.body["error"]["attempts"] == 4


def test_retries_stop_at_the_deadline():
    calls = []

    async def unavailable(doc):
        calls.append(1)
        raise Unavailable("down")

    g = graph(
        [
            model(
                "m",
                retry={"attempts": 10, "initial_backoff_ms": 200, "max_backoff_ms": 200, "retry_on": ["UNAVAILABLE"]},
            )
        ],
        [("request", "m"), ("m", "response")],
        deadline_ms=300,
    )

    class Max(random.Random):
        def uniform(self, a, b):
            return b

    started = time.monotonic()
    result = run(Executor(g, {"m": unavailable}, rng=Max()).run({}))
    assert time.monotonic() - started < 0.5
    assert len(calls) == 2  # a third backoff would cross the deadline
    assert result.body["error"]["code"] == "UNAVAILABLE"


# ---- errors ----------------------------------------------------------------------------------


def test_a_failed_node_is_named_and_its_error_never_flows_on():
    g = graph([model("a"), model("b")], [("request", "a"), ("a", "b"), ("b", "response")])
    rec = Recorder()
    ex = Executor(g, {"a": rec.fn("a", None, fail=ValueError("weights missing")), "b": rec.fn("b", 1)})
    result = run(ex.run({}))
    assert result.status == 502
    assert result.body == {
        "error": {"code": "NODE_FAILED", "node": "a", "message": "a: ValueError: weights missing", "attempts": 1}
    }
    assert rec.names() == ["a"]


def test_a_failure_cancels_work_in_flight():
    g = graph(
        [model("bad"), model("slow")],
        [
            ("request", "bad"),
            ("request", "slow"),
            {"source": "bad", "target": "response", "into": "/bad"},
            {"source": "slow", "target": "response", "into": "/slow"},
        ],
    )
    rec = Recorder()
    ex = Executor(
        g, {"bad": rec.fn("bad", None, delay=0.05, fail=RuntimeError("x")), "slow": rec.fn("slow", 1, delay=5)}
    )

    async def scenario():
        result = await ex.run({})
        await asyncio.sleep(0.01)
        return result

    assert run(scenario()).body["error"]["node"] == "bad"
    assert rec.cancelled == ["slow"]


class NotFound(Exception):
    status_code = 404


@pytest.mark.parametrize(
    "exc,status,code",
    [
        (NotFound("no such user"), 404, "NODE_FAILED"),
        (Backpressure("queue full"), 503, "BACKPRESSURE"),
        (Unavailable("replica died"), 502, "UNAVAILABLE"),
    ],
)
def test_status_codes(exc, status, code):
    g = graph([model("m")], [("request", "m"), ("m", "response")])
    result = run(Executor(g, {"m": Recorder().fn("m", None, fail=exc)}).run({}))
    assert result.status == status
    assert result.body["error"]["code"] == code
    assert result.body["error"]["node"] == "m"


def test_fallback_value_replaces_a_failed_output():
    g = graph(
        [model("m", on_error="FALLBACK", fallback_value={"label": "unknown"})], [("request", "m"), ("m", "response")]
    )
    result = run(Executor(g, {"m": Recorder().fn("m", None, fail=RuntimeError("x"))}).run({}))
    assert (result.status, result.body, result.headers["x-raypipe-fallback"]) == (200, {"label": "unknown"}, "m")


def test_a_body_that_is_not_json_is_invalid_input_where_read():
    g = graph(
        [{"name": "s", "switch": {"on_no_match": "ERROR"}}, model("m")],
        [
            ("request", "s"),
            {"source": "s", "target": "m", "when": {"compare": {"path": "/request/x", "op": "EXISTS"}}},
            ("m", "response"),
        ],
    )
    result = run(Executor(g, {"m": Recorder().fn("m", 1)}).run(RawBody("plain text")))
    assert result.status == 400
    assert result.body["error"]["code"] == "INVALID_INPUT"
    # Passed on whole, text is fine.
    g = graph([model("m")], [("request", "m"), ("m", "response")])
    result = run(Executor(g, {"m": Recorder().fn("m", lambda d: d.upper())}).run(RawBody("plain text")))
    assert result.body == "PLAIN TEXT"


def test_a_select_that_misses_fails_the_target_unless_optional():
    g = graph(
        [model("a"), model("b")],
        [("request", "a"), {"source": "a", "target": "b", "select": "/result"}, ("b", "response")],
    )
    result = run(Executor(g, {"a": Recorder().fn("a", {"other": 1}), "b": Recorder().fn("b", 1)}).run({}))
    assert result.status == 502
    assert result.body["error"]["code"] == "SELECT_MISSING"
    assert result.body["error"]["node"] == "b"
    assert "a->b" in result.body["error"]["message"]


# ---- input assembly, call styles, headers --------------------------------------------------------


def test_template_select_into_if_missing_and_kwargs():
    g = graph(
        [model("a"), model("k", input_template={"mode": "fast", "opts": {"n": 1}})],
        [
            ("request", "a"),
            {"source": "a", "target": "k", "select": "/pred/0", "into": "/opts/first"},
            {"source": "request", "target": "k", "select": "/user", "into": "/user"},
            {
                "source": "request",
                "target": "k",
                "select": "/absent",
                "into": "/extra",
                "optional": True,
                "if_missing": 0,
            },
            ("k", "response"),
        ],
    )
    g.nodes["k"].model.call_style = "KWARGS"
    rec = Recorder()
    ex = Executor(g, {"a": rec.fn("a", {"pred": [7, 8]}), "k": rec.fn("k", lambda **kw: kw)})
    result = run(ex.run({"user": "ada"}))
    assert result.body == {"mode": "fast", "opts": {"n": 1, "first": 7}, "user": "ada", "extra": 0}
    assert rec.calls[1][1] == ()  # called with keyword arguments only


def test_tensor_selection_appends_renamed_inputs():
    g = graph(
        [model("a"), model("b")],
        [
            ("request", "a"),
            {"source": "a", "target": "b", "tensors": {"names": ["OUT1"], "rename": {"OUT1": "IN0"}}},
            ("b", "response"),
        ],
    )
    outputs = {"outputs": [{"name": "OUT0", "data": [0]}, {"name": "OUT1", "data": [1, 2]}]}
    ex = Executor(g, {"a": Recorder().fn("a", outputs), "b": Recorder().fn("b", lambda d: d)})
    assert run(ex.run({})).body == {"inputs": [{"name": "IN0", "data": [1, 2]}]}


def test_forward_headers_reach_nodes_that_take_them():
    g = graph(
        [model("a"), model("b")], [("request", "a"), ("a", "b"), ("b", "response")], forward_headers=["x-request-id"]
    )
    rec = Recorder()
    ex = Executor(g, {"a": rec.fn("a", 1), "b": rec.fn("b", lambda d, headers: headers)}, header_nodes=["b"])
    result = run(ex.run({}, {"X-Request-Id": "r-1", "Authorization": "secret"}))
    assert result.body == {"x-request-id": "r-1"}
    assert rec.calls[0][2] == {}  # a does not declare `headers`


def test_a_cancelled_request_cancels_its_calls():
    g = graph([model("slow")], [("request", "slow"), ("slow", "response")])
    rec = Recorder()
    ex = Executor(g, {"slow": rec.fn("slow", 1, delay=5)})

    async def scenario():
        task = asyncio.ensure_future(ex.run({}))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)

    run(scenario())
    assert rec.cancelled == ["slow"]


def test_missing_callers_are_refused():
    g = graph([model("m")], [("request", "m"), ("m", "response")])
    with pytest.raises(ValueError, match="m"):
        Executor(g, {})
    assert engine.STATUS["DEADLINE"] == 504


# ---- the hot path: where calls run ---------------------------------------------------------------


def count_tasks(coro_factory):
    """Runs a scenario and returns (its result, the asyncio tasks created while it ran)."""
    created = []

    async def scenario():
        loop = asyncio.get_running_loop()

        def factory(loop, coro, **kwargs):
            task = asyncio.Task(coro, loop=loop, **kwargs)
            created.append(task)
            return task

        loop.set_task_factory(factory)
        try:
            return await coro_factory()
        finally:
            loop.set_task_factory(None)

    result = run(scenario())
    return result, [task.get_name() for task in created]


def test_a_straight_path_runs_in_the_request_coroutine_and_fan_out_in_tasks():
    chain = graph(
        [model("a"), model("b", timeout_ms=1000), model("c")],
        [("request", "a"), ("a", "b"), ("b", "c"), ("c", "response")],
    )
    rec = Recorder()
    ex = Executor(chain, {n: rec.fn(n, lambda d: d + 1) for n in "abc"})
    result, created = count_tasks(lambda: ex.run(0))
    assert (result.status, result.body) == (200, 3)
    assert created == []

    fan = graph(
        [model("a"), model("b"), model("c")],
        [
            ("request", "a"),
            ("request", "b"),
            {"source": "a", "target": "c", "into": "/a"},
            {"source": "b", "target": "c", "into": "/b"},
            ("c", "response"),
        ],
    )
    ex = Executor(fan, {"a": rec.fn("a", 1), "b": rec.fn("b", 2), "c": rec.fn("c", lambda d: d)})
    result, created = count_tasks(lambda: ex.run({}))
    assert result.body == {"a": 1, "b": 2}
    assert created == ["raypipe:a", "raypipe:b"]  # c, alone again after the join, runs inline


def test_a_call_that_becomes_ready_beside_running_work_never_delays_the_response():
    # fast -> after_fast races slow into a join ANY: after_fast must not wait for slow, and
    # the response must not wait for slow either.
    g = graph(
        [model("fast"), model("after_fast"), model("slow")],
        [
            ("request", "fast"),
            ("fast", "after_fast"),
            ("request", "slow"),
            ("after_fast", "response"),
            ("slow", "response"),
        ],
        output={"join": "ANY"},
    )
    rec = Recorder()
    ex = Executor(
        g,
        {
            "fast": rec.fn("fast", 1, delay=0.01),
            "after_fast": rec.fn("after_fast", "won", delay=0.01),
            "slow": rec.fn("slow", "lost", delay=5),
        },
    )

    async def scenario():
        result = await ex.run({})
        await asyncio.sleep(0.01)
        return result

    assert run(scenario()).body == "won"
    assert rec.cancelled == ["slow"]  # the response came while slow still ran


def test_a_cancellation_the_callee_raises_itself_is_a_failure_of_the_node():
    if not hasattr(asyncio.Task, "cancelling"):
        pytest.skip("Python 3.10 cannot tell a callee's CancelledError from the request's cancellation")

    async def gives_up(doc):
        raise asyncio.CancelledError()

    for edges in (
        [("request", "m"), ("m", "response")],  # awaited inline
        [
            ("request", "m"),
            ("request", "n"),  # in a task beside another call
            {"source": "m", "target": "response", "into": "/m"},
            {"source": "n", "target": "response", "into": "/n"},
        ],
    ):
        nodes = [model("m")] + ([model("n")] if len(edges) > 2 else [])
        ex = Executor(graph(nodes, edges), {"m": gives_up, "n": Recorder().fn("n", 1)})
        result = run(ex.run({}))
        assert result.status == 502, result.body
        assert result.body["error"] == {
            "code": "UNAVAILABLE",
            "node": "m",
            "message": "m: the call was cancelled",
            "attempts": 1,
        }


def test_a_timeout_error_of_the_model_itself_is_an_application_error():
    async def raises_timeout(doc):
        raise TimeoutError("upstream model server timed out")

    g = graph([model("m", timeout_ms=1000)], [("request", "m"), ("m", "response")])
    result = run(Executor(g, {"m": raises_timeout}).run({}))
    assert result.status == 502
    assert result.body["error"]["code"] == "NODE_FAILED"
    assert "upstream model server timed out" in result.body["error"]["message"]


def test_a_node_timeout_beyond_the_deadline_ends_as_the_deadline():
    g = graph([model("m", timeout_ms=5000)], [("request", "m"), ("m", "response")], deadline_ms=100)
    rec = Recorder()
    result = run(Executor(g, {"m": rec.fn("m", 1, delay=5)}).run({}))
    assert result.status == 504
    assert result.body["error"]["code"] == "DEADLINE"
    assert result.body["error"]["node"] == "m"
    assert rec.cancelled == ["m"]


def test_a_shadow_call_is_bounded_by_the_request_deadline():
    g = graph(
        [model("main"), model("shadow", shadow={})],
        [("request", "main"), ("main", "response"), ("request", "shadow")],
        deadline_ms=100,
    )
    rec = Recorder()
    ex = Executor(g, {"main": rec.fn("main", "ok"), "shadow": rec.fn("shadow", 1, delay=5)})

    async def scenario():
        result = await ex.run({})
        await ex.wait_idle(2)
        return result

    assert run(scenario()).body == "ok"
    assert rec.cancelled == ["shadow"]  # cut at the deadline, not left to run its 5 s


# ---- backpressure ------------------------------------------------------------------------------


@pytest.mark.parametrize("retry_after_s,header", [(None, "1"), (2.5, "3"), (0, "0")])
def test_backpressure_answers_503_naming_the_node_with_retry_after(retry_after_s, header):
    g = graph([model("a"), model("busy")], [("request", "a"), ("a", "busy"), ("busy", "response")])
    rec = Recorder()
    full = Backpressure(
        "Request dropped due to backpressure (num_queued_requests=4, max_queued_requests=4).",
        retry_after_s=retry_after_s,
    )
    result = run(Executor(g, {"a": rec.fn("a", 1), "busy": rec.fn("busy", None, fail=full)}).run({}))
    assert result.status == 503
    assert result.body["error"]["code"] == "BACKPRESSURE"
    assert result.body["error"]["node"] == "busy"
    assert "max_queued_requests=4" in result.body["error"]["message"]
    assert result.headers["retry-after"] == header


def test_only_backpressure_sets_retry_after():
    g = graph([model("m")], [("request", "m"), ("m", "response")])
    result = run(Executor(g, {"m": Recorder().fn("m", None, fail=Unavailable("gone"))}).run({}))
    assert result.status == 502
    assert "retry-after" not in result.headers


def test_the_python_3_10_stand_in_for_asyncio_timeout_keeps_timeouts_and_deadlines(monkeypatch):
    # Ray 2.60 still runs on Python 3.10, which has no asyncio.timeout: the engine brings its own.
    monkeypatch.setattr(timeouts, "timeout_at", timeouts.TimeoutAt)
    test_node_timeout_names_the_node()
    test_the_request_deadline_bounds_every_call()
    test_a_node_timeout_beyond_the_deadline_ends_as_the_deadline()
    test_a_shadow_call_is_bounded_by_the_request_deadline()
    test_a_timeout_error_of_the_model_itself_is_an_application_error()
