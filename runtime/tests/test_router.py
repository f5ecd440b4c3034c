"""The rollout router's logic without Ray: config checks, the choice, counting, histograms,
the stats merge and the routing of one request over fake version calls."""

import copy
import json

import pytest
from conftest import run

from raypipe_runtime import engine
from raypipe_runtime.router import (
    BOUNDS_MS,
    CANARY,
    HEADER_ROLLOUT,
    HEADER_VERSION,
    ROUTER_LISTED_S,
    STABLE,
    Counters,
    Ledger,
    RouterConfigError,
    StatsBook,
    Target,
    bucket_index,
    choose_role,
    no_config_reply,
    parse_config,
    parse_router_args,
    route_request,
)

CONFIG = {
    "generation": "3f2a9c1b0d4e-2",
    "stable": {"app": "pipe--aaaaaaaaaaaa", "deployment": "raypipe-executor", "version": "v1"},
    "canary": {"app": "pipe--bbbbbbbbbbbb", "deployment": "raypipe-executor", "version": "v2", "weight": 10.0},
    "retry_on_stable": True,
}


def config(**changes):
    raw = copy.deepcopy(CONFIG)
    canary_changes = changes.pop("canary_changes", {})
    raw.update(changes)
    if raw.get("canary"):
        raw["canary"].update(canary_changes)
    return parse_config(raw)


def problems_of(raw) -> dict:
    with pytest.raises(RouterConfigError) as caught:
        parse_config(raw)
    return dict(caught.value.problems)


# ---- config -----------------------------------------------------------------------------------


def test_config_of_the_contract_parses():
    parsed = config()
    assert parsed.generation == "3f2a9c1b0d4e-2"
    assert parsed.stable == Target("pipe--aaaaaaaaaaaa", "raypipe-executor", "v1")
    assert parsed.canary == Target("pipe--bbbbbbbbbbbb", "raypipe-executor", "v2")
    assert (parsed.weight, parsed.retry_on_stable) == (10.0, True)
    assert parsed.target(CANARY) == parsed.canary and parsed.target(STABLE) == parsed.stable


def test_canary_null_or_absent_means_all_stable():
    for raw in ({**CONFIG, "canary": None}, {k: v for k, v in CONFIG.items() if k != "canary"}):
        parsed = parse_config(raw)
        assert parsed.canary is None and parsed.weight == 0.0
        assert choose_role(parsed, 0.0) == STABLE
        assert parsed.target(CANARY) == parsed.stable


def test_malformed_configs_name_every_field():
    bad = copy.deepcopy(CONFIG)
    bad["generation"] = ""
    bad["stable"]["version"] = "v 1\n"
    bad["canary"]["weight"] = 100.5
    bad["retry_on_stable"] = "yes"
    bad["extra"] = 1
    problems = problems_of(bad)
    assert set(problems) == {
        "user_config.generation",
        "user_config.stable.version",
        "user_config.canary.weight",
        "user_config.retry_on_stable",
        "user_config.extra",
    }
    assert "0 to 100" in problems["user_config.canary.weight"]

    for weight in (True, float("nan"), float("inf"), 10**400, -1, "10", None):
        assert "user_config.canary.weight" in problems_of({**CONFIG, "canary": {**CONFIG["canary"], "weight": weight}})
    assert "user_config.stable" in problems_of({**CONFIG, "stable": ["pipe"]})
    assert "user_config.canary.app" in problems_of({**CONFIG, "canary": {**CONFIG["stable"], "weight": 5}})
    assert "user_config" in problems_of("not an object")
    with pytest.raises(RouterConfigError) as caught:
        parse_config({**CONFIG, "stable": {}})
    assert "user_config.stable.app" in str(caught.value)


def test_router_args_carry_only_the_contract_version():
    parse_router_args({"api_version": "raypipe.router.v1"})
    for args in ({"api_version": "raypipe.v1"}, {}, None, {"api_version": "raypipe.router.v1", "x": 1}):
        with pytest.raises(RouterConfigError):
            parse_router_args(args)


# ---- the choice and the counting ---------------------------------------------------------------


def test_choice_follows_the_weight():
    assert choose_role(config(canary_changes={"weight": 0}), 0.0) == STABLE
    assert choose_role(config(canary_changes={"weight": 100}), 0.999999) == CANARY
    ten = config()
    assert choose_role(ten, 0.0999) == CANARY
    assert choose_role(ten, 0.1) == STABLE
    # Over an even spread of draws the share is the weight.
    draws = [i / 1000 for i in range(1000)]
    assert sum(choose_role(config(canary_changes={"weight": 37.5}), d) == CANARY for d in draws) == 375


def test_histogram_buckets_are_upper_bounds_plus_overflow():
    assert len(BOUNDS_MS) == 24
    assert bucket_index(0.0) == 0
    assert bucket_index(1) == 0
    assert bucket_index(1.0001) == 1
    assert bucket_index(7.5) == 4
    assert bucket_index(30000) == 23
    assert bucket_index(30000.5) == 24


def test_counters_record_and_merge():
    c = Counters()
    c.record(0.5, failed=False)
    c.record(12.0, failed=True, retried=True)
    c.record(40000.0, failed=False)
    d = c.to_dict()
    assert (d["requests"], d["errors"], d["retried"], d["sum_ms"]) == (3, 1, 1, 40012.5)
    assert len(d["buckets"]) == 25 and sum(d["buckets"]) == 3
    assert d["buckets"][0] == d["buckets"][bucket_index(12.0)] == d["buckets"][24] == 1

    total = Counters()
    total.add(d)
    total.add(d)
    total.add({"requests": 1})  # malformed: ignored, not half-added
    total.add({**d, "buckets": [1, 2]})
    total.add({**d, "sum_ms": 10**400})
    total.add({**d, "buckets": [float("inf")] * 25})
    assert total.to_dict() == {
        **d,
        "requests": 6,
        "errors": 2,
        "retried": 2,
        "sum_ms": 80025.0,
        "buckets": [2 * b for b in d["buckets"]],
    }


def test_ledger_reports_current_and_previous_generation_and_keeps_four():
    ledger = Ledger()
    for n in range(6):
        ledger.activate(f"g{n}")
        ledger.record(f"g{n}", STABLE, 1.0, failed=False)
    assert list(ledger.generations) == ["g2", "g3", "g4", "g5"]
    assert set(ledger.report()) == {"g4", "g5"}
    # A request that outlived its generation still counts there...
    ledger.record("g4", CANARY, 2.0, failed=True)
    assert ledger.report()["g4"][CANARY]["errors"] == 1
    # ...but one whose generation is long gone never pushes out the current ones.
    ledger.record("g0", STABLE, 1.0, failed=False)
    assert list(ledger.generations) == ["g2", "g3", "g4", "g5"]
    # Going back to a kept generation makes it current again.
    ledger.activate("g3")
    assert list(ledger.report()) == ["g5", "g3"]


# ---- the stats merge ---------------------------------------------------------------------------


def report(replica, seq, generation, counts):
    """A router's report with `counts` = {generation: {role: [latency ms, ...]}}."""
    counters = {}
    for gen, roles in counts.items():
        counters[gen] = {}
        for role in (STABLE, CANARY):
            c = Counters()
            for latency in roles.get(role, []):
                c.record(latency, failed=latency >= 100)
            counters[gen][role] = c.to_dict()
    return {"replica": replica, "seq": seq, "generation": generation, "counters": counters}


def test_stats_sum_the_latest_report_of_every_router():
    book = StatsBook()
    book.accept(report("r1", 1, "g1", {"g1": {STABLE: [5]}}), now=0.0)
    book.accept(report("r1", 2, "g1", {"g1": {STABLE: [5, 5], CANARY: [200]}}), now=0.5)
    book.accept(report("r2", 1, "g1", {"g1": {STABLE: [1]}}), now=0.6)
    book.accept(report("r1", 1, "g1", {"g1": {STABLE: [5] * 50}}), now=0.7)  # late, older: ignored
    snap = book.snapshot("g1", now=1.0)
    assert snap["generation"] == "g1" and snap["bounds_ms"] == list(BOUNDS_MS)
    assert snap[STABLE]["requests"] == 3 and snap[STABLE]["sum_ms"] == 11.0
    assert (snap[CANARY]["requests"], snap[CANARY]["errors"]) == (1, 1)
    assert snap["routers"] == {"r1": {"generation": "g1", "age_s": 0.5}, "r2": {"generation": "g1", "age_s": 0.4}}
    json.dumps(snap)  # what the router sends back as its HTTP answer

    # r1 moves on to g2 and reports both; g1's sums stay, g2 starts from its own counts.
    book.accept(report("r1", 3, "g2", {"g1": {STABLE: [5, 5], CANARY: [200]}, "g2": {CANARY: [3]}}), now=2.0)
    assert book.snapshot("g1", now=2.0)[STABLE]["requests"] == 3
    g2 = book.snapshot("g2", now=2.0)
    assert (g2[STABLE]["requests"], g2[CANARY]["requests"], g2[CANARY]["errors"]) == (0, 1, 0)
    assert g2["routers"]["r1"]["generation"] == "g2" and g2["routers"]["r2"]["generation"] == "g1"

    # A router that refused its newest config says why, on the generation it still routes by.
    book.accept({**report("r2", 2, "g1", {}), "config_error": "user_config.canary.weight: ..."}, now=2.5)
    listed = book.snapshot("g1", now=3.0)["routers"]
    assert listed["r2"] == {"generation": "g1", "age_s": 0.5, "config_error": "user_config.canary.weight: ..."}
    assert "config_error" not in listed["r1"]

    # A silent router drops out of the listing after ROUTER_LISTED_S; its counts remain.
    later = book.snapshot("g1", now=2.5 + ROUTER_LISTED_S + 1)
    assert "r2" not in later["routers"] and later[STABLE]["requests"] == 3


def test_stats_are_bounded_and_tolerate_junk():
    book = StatsBook(keep=3)
    for n in range(5):
        book.accept(report("r1", n + 1, f"g{n}", {f"g{n}": {STABLE: [1]}}), now=float(n))
    assert list(book.by_generation) == ["g2", "g3", "g4"]
    assert book.snapshot("g0", now=5.0)[STABLE] == Counters().to_dict()
    assert book.snapshot("unknown", now=5.0)[CANARY]["requests"] == 0
    for junk in (
        None,
        {},
        {"replica": "r9", "seq": True},
        {"replica": "r9", "seq": 1, "counters": [1]},
        {"replica": "r9", "seq": 2, "counters": {"g4": {STABLE: "x", CANARY: {"requests": "many"}}}},
    ):
        book.accept(junk, now=5.0)
    assert book.snapshot("g4", now=5.0)[STABLE]["requests"] == 1
    assert book.snapshot(None, now=1000.0)["routers"] == {}
    assert book.routers == {}  # forgotten after ROUTER_FORGOTTEN_S


# ---- routing one request -----------------------------------------------------------------------


class Versions:
    """Fake version calls: each app answers with a status (or raises) and records its calls."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    async def __call__(self, target, body, headers):
        self.calls.append((target.app, body, headers))
        answer = self.answers[target.app]
        if isinstance(answer, Exception):
            raise answer
        return answer, json.dumps({"from": target.app}).encode(), "application/json", {"x-raypipe-graph": target.app}


A, B = CONFIG["stable"]["app"], CONFIG["canary"]["app"]


def routed(cfg, versions, draw, ledger=None):
    ledger = ledger or Ledger()
    ledger.activate(cfg.generation)
    status, content, _media, headers = run(
        route_request(cfg, ledger, versions, b'{"x": 1}', {"x-request-id": "7"}, draw)
    )
    return status, json.loads(content), headers, ledger.report()[cfg.generation]


def test_stable_and_canary_answer_with_their_labels():
    versions = Versions({A: 200, B: 200})
    status, body, headers, counts = routed(config(), versions, draw=0.5)
    assert (status, body) == (200, {"from": A})
    assert headers == {"x-raypipe-graph": A, HEADER_VERSION: "v1", HEADER_ROLLOUT: "stable"}
    assert (counts[STABLE]["requests"], counts[CANARY]["requests"]) == (1, 0)

    status, body, headers, counts = routed(config(), versions, draw=0.05)
    assert (status, body, headers[HEADER_VERSION], headers[HEADER_ROLLOUT]) == (200, {"from": B}, "v2", "canary")
    assert (counts[STABLE]["requests"], counts[CANARY]["requests"], counts[CANARY]["errors"]) == (0, 1, 0)
    assert versions.calls[-1] == (B, b'{"x": 1}', {"x-request-id": "7"})


def test_a_failed_canary_is_retried_on_stable_and_counted():
    for failure in (500, 503, engine.Unavailable("ActorDiedError")):
        versions = Versions({A: 200, B: failure})
        status, body, headers, counts = routed(config(), versions, draw=0.0)
        assert (status, body, headers[HEADER_VERSION], headers[HEADER_ROLLOUT]) == (200, {"from": A}, "v1", "retried")
        assert [c[0] for c in versions.calls] == [B, A]
        assert versions.calls[0][1:] == versions.calls[1][1:]  # the same body and headers
        assert counts[CANARY]["requests"] == counts[CANARY]["errors"] == counts[CANARY]["retried"] == 1
        assert (counts[STABLE]["requests"], counts[STABLE]["errors"]) == (1, 0)


def test_a_failed_canary_without_retry_answers_the_client():
    status, body, headers, counts = routed(config(retry_on_stable=False), Versions({A: 200, B: 502}), draw=0.0)
    assert (status, headers[HEADER_ROLLOUT]) == (502, "canary")
    assert (counts[CANARY]["errors"], counts[CANARY]["retried"], counts[STABLE]["requests"]) == (1, 0, 0)

    status, body, headers, _ = routed(
        config(retry_on_stable=False), Versions({A: 200, B: engine.Backpressure("queue full")}), draw=0.0
    )
    assert (status, body["error"]["code"], headers[HEADER_VERSION]) == (503, "BACKPRESSURE", "v2")
    assert headers["retry-after"] == "1", "Serve gave no retry_after_s: one second"
    status, _, headers, _ = routed(
        config(retry_on_stable=False), Versions({A: 200, B: engine.Backpressure("full", retry_after_s=2.5)}), draw=0.0
    )
    assert (status, headers["retry-after"]) == (503, "3")


def test_client_errors_are_not_canary_failures():
    versions = Versions({A: 200, B: 422})
    status, _, headers, counts = routed(config(), versions, draw=0.0)
    assert (status, headers[HEADER_ROLLOUT], counts[CANARY]["errors"]) == (422, "canary", 0)
    assert len(versions.calls) == 1


def test_stable_unavailable_is_503_in_the_engine_shape():
    status, body, headers, counts = routed(config(canary=None), Versions({A: KeyError("gone")}), draw=0.0)
    assert status == 503
    assert body["error"]["code"] == "UNAVAILABLE" and body["error"]["node"] is None
    assert "pipe--aaaaaaaaaaaa" in body["error"]["message"]
    assert (headers[HEADER_VERSION], headers[HEADER_ROLLOUT]) == ("v1", "stable")
    assert (counts[STABLE]["requests"], counts[STABLE]["errors"]) == (1, 1)

    # A malformed answer is the version's failure, not the router's crash.
    async def malformed(target, body, headers):
        return "not a tuple"

    ledger = Ledger()
    ledger.activate("3f2a9c1b0d4e-2")
    status, *_ = run(route_request(config(), ledger, malformed, b"", {}, 0.0))
    assert status == 503 and ledger.report()["3f2a9c1b0d4e-2"][CANARY]["retried"] == 1


def test_no_config_answer():
    status, content, media, _headers = no_config_reply()
    body = json.loads(content)
    assert (status, media, body["error"]["code"], body["error"]["node"]) == (
        503,
        "application/json",
        "UNAVAILABLE",
        None,
    )
    assert "no configuration yet" in body["error"]["message"]


def test_build_binds_the_router_to_its_stats_deployment():
    pytest.importorskip("ray.serve", reason="ray[serve] is not installed in this interpreter")
    from raypipe_runtime.router import build

    router = build({"api_version": "raypipe.router.v1"})._bound_deployment
    stats = router._replica_config.init_args[1]._bound_deployment
    assert (router.name, router.max_ongoing_requests, router.ray_actor_options["num_cpus"]) == (
        "raypipe-router",
        100,
        0.1,
    )
    assert (stats.name, stats.num_replicas, stats.ray_actor_options["num_cpus"]) == ("raypipe-rollout-stats", 1, 0.1)
    with pytest.raises(RouterConfigError):
        build({"api_version": "raypipe.v1"})


def test_the_first_calls_to_a_version_count_but_leave_its_latency_alone():
    from raypipe_runtime.router import WARMUP_CALLS, Counters, Ledger

    ledger = Ledger()
    warm = [ledger.warm("pipe--a") for _ in range(WARMUP_CALLS + 2)]
    assert warm == [False] * WARMUP_CALLS + [True, True]
    assert ledger.warm("pipe--b") is False, "each version warms up on its own"
    c = Counters()
    c.record(None, failed=True)
    c.record(3.0, failed=False)
    d = c.to_dict()
    assert (d["requests"], d["errors"], sum(d["buckets"]), d["sum_ms"]) == (2, 1, 1, 3.0)
