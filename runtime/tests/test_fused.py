"""Fused nodes (`args.fused_nodes`) without a cluster: the executor deployment's class
(`GraphExecutor`) constructs them itself and calls them in-process, with the semantics of a
node behind a handle: per-node timeout (async and plain methods), retries, errors naming the
node (a user 4xx kept), fallback, shadow sampling, per-node metrics; plus the args checks."""

import itertools
import json
import os
import threading

import pytest
from conftest import run

try:
    import ray  # noqa: F401
except ImportError:  # pragma: no cover
    if os.environ.get("RAYPIPE_REQUIRE_RAY") == "1":
        raise
    pytest.skip("ray[serve] is not installed in this interpreter", allow_module_level=True)

import fused_models

from raypipe_runtime import engine, metrics
from raypipe_runtime.app import GraphExecutor, bind_models
from raypipe_runtime.spec import ArgsError, parse_args


class RecordingObserver(engine.Observer):
    def __init__(self):
        self.outcomes = []
        self.calls = []
        self.requests = []

    def node_outcome(self, node, outcome):
        self.outcomes.append((node, outcome))

    def node_call(self, node, ms):
        self.calls.append(node)

    def request(self, status, overhead_ms):
        self.requests.append(status)


@pytest.fixture
def observer(monkeypatch):
    recorder = RecordingObserver()
    monkeypatch.setattr(metrics, "ray_observer", lambda graph: recorder)
    fused_models.INSTANCES.clear()
    return recorder


def model(name, cls, method=None, **extra):
    init = extra.pop("init", {})
    body = {"import_path": f"fused_models:{cls}", "init_kwargs": {"key": name, **init}}
    if cls in ("BrokenAtStart", "plain_function"):
        del body["init_kwargs"]
    if method:
        body["method"] = method
    return {"name": name, "model": body, **extra}


def args_of(nodes, edges, fused=None, **graph):
    names = [n["name"] for n in nodes]
    return {
        "api_version": "raypipe.v1",
        "executor_deployment": "raypipe-executor",
        "graph": {
            "name": "fused",
            "version": "1",
            "ingress": "request",
            "nodes": [{"name": "request", "input": {}}, *nodes, {"name": "response", "output": {}}],
            "edges": [{"source": s, "target": t, **(e[2] if len(e) > 2 else {})} for e in edges for s, t in [e[:2]]],
            **graph,
        },
        "fused_nodes": names if fused is None else fused,
    }


def chain(*nodes):
    names = ["request", *[n["name"] for n in nodes], "response"]
    return list(itertools.pairwise(names))


def call(executor, body, headers=None):
    status, content, _, response_headers = run(executor.handle_request(json.dumps(body).encode(), headers or {}))
    return status, json.loads(content), response_headers


def test_a_fused_chain_runs_in_process_and_constructs_each_model_once(observer):
    nodes = [
        model("add", "AsyncAdd", init={"amount": 3}),
        model("double", "SyncDouble", "predict"),
        model("fn", "plain_function"),
    ]
    args = args_of(nodes, chain(*nodes))
    bound, _ = bind_models(parse_args(args))
    assert bound == {}  # no deployment for any of them
    executor = GraphExecutor(args, {}, [])
    for i in range(3):
        assert call(executor, i)[:2] == (200, {"function saw": (i + 3) * 2})
    (add,), (double,) = fused_models.INSTANCES["add"], fused_models.INSTANCES["double"]
    assert (add.calls, double.calls) == (3, 3)
    # A coroutine runs on the executor's loop; a plain method in a worker thread, as Serve
    # runs it in a replica (RAY_SERVE_RUN_SYNC_IN_THREADPOOL).
    assert set(add.threads) == {threading.main_thread().name}
    assert threading.main_thread().name not in double.threads
    assert observer.outcomes.count(("add", "ok")) == 3 and observer.requests == [200] * 3


def test_only_the_listed_nodes_are_fused(observer):
    nodes = [model("add", "AsyncAdd"), model("double", "SyncDouble", "predict")]
    bound, _ = bind_models(parse_args(args_of(nodes, chain(*nodes), fused=["double"])))
    assert set(bound) == {"add"}


def test_the_node_timeout_ends_async_and_plain_calls(observer):
    for cls, method in (("AsyncAdd", None), ("SyncDouble", "predict")):
        nodes = [model("slow", cls, method, init={"delay_s": 2.0}, timeout_ms=100)]
        executor = GraphExecutor(args_of(nodes, chain(*nodes)), {}, [])
        status, body, _ = call(executor, 1)
        assert status == 504, body
        assert (body["error"]["code"], body["error"]["node"]) == ("TIMEOUT", "slow")
        assert "timed out after 100 ms" in body["error"]["message"]
    assert observer.outcomes == [("slow", "timeout")] * 2


def test_retries_call_the_fused_model_again(observer):
    nodes = [
        model(
            "flaky",
            "Flaky",
            init={"failures": 2},
            retry={"attempts": 3, "initial_backoff_ms": 1, "max_backoff_ms": 2, "retry_on": ["APP_ERROR"]},
        )
    ]
    executor = GraphExecutor(args_of(nodes, chain(*nodes)), {}, [])
    status, body, headers = call(executor, {"x": 1}, {"x-raypipe-trace": "1"})
    assert (status, body) == (200, {"x": 1})
    assert json.loads(headers["x-raypipe-trace"])["flaky"]["attempts"] == 3
    assert fused_models.INSTANCES["flaky"][0].calls == 3


def test_errors_name_the_fused_node_and_keep_a_user_4xx(observer):
    nodes = [model("boom", "Raises")]
    status, body, _ = call(GraphExecutor(args_of(nodes, chain(*nodes)), {}, []), 1)
    assert status == 502
    assert body["error"] == {
        "code": "NODE_FAILED",
        "node": "boom",
        "message": "boom: RuntimeError: model exploded",
        "attempts": 1,
    }
    nodes = [model("taken", "Raises", init={"conflict": True})]
    status, body, _ = call(GraphExecutor(args_of(nodes, chain(*nodes)), {}, []), 1)
    assert (status, body["error"]["node"]) == (409, "taken")
    assert observer.outcomes == [("boom", "error"), ("taken", "error")]


def test_fallback_and_shadow_of_fused_nodes(observer):
    nodes = [
        model("boom", "Raises", on_error="FALLBACK", fallback_value={"fallback": True}),
        model("shadow", "Raises", shadow={"sample_percent": 100}),
    ]
    edges = [("request", "boom"), ("boom", "response"), ("request", "shadow")]
    executor = GraphExecutor(args_of(nodes, edges), {}, [])

    async def scenario():
        answer = await executor.handle_request(b"1", {})
        await executor.executor.wait_idle(5)
        return answer

    status, content, _, headers = run(scenario())
    assert (status, json.loads(content)) == (200, {"fallback": True})
    assert headers["x-raypipe-fallback"] == "boom"
    assert fused_models.INSTANCES["shadow"][0].calls == 1  # sampled, ran, its failure only logged
    assert sorted(observer.outcomes) == [("boom", "fallback"), ("shadow", "shadow_failed")]
    assert sorted(observer.calls) == ["boom", "shadow"]


def test_a_fused_model_that_cannot_start_names_its_node(observer):
    nodes = [model("broken", "BrokenAtStart")]
    with pytest.raises(
        RuntimeError,
        match=r"fused node 'broken' \(fused_models:BrokenAtStart\) failed to "
        r"construct: RuntimeError: weights are missing",
    ):
        GraphExecutor(args_of(nodes, chain(*nodes)), {}, [])


def test_fused_nodes_must_be_distinct_model_nodes():
    nodes = [model("add", "AsyncAdd")]
    with pytest.raises(ArgsError) as caught:
        parse_args(args_of(nodes, chain(*nodes), fused=["add", "add", "request", "ghost"]))
    assert dict(caught.value.problems) == {
        "args.fused_nodes[1]": "'add' is listed twice",
        "args.fused_nodes[2]": "'request' is not a model node of the graph",
        "args.fused_nodes[3]": "'ghost' is not a model node of the graph",
    }
    with pytest.raises(ArgsError, match="must be a list of model node names"):
        parse_args({**args_of(nodes, chain(*nodes)), "fused_nodes": "add"})
    # The graph file's own switches are accepted (and ignored) in args.
    graph_file = args_of(nodes, chain(*nodes))
    graph_file["graph"]["fuse"] = False
    graph_file["graph"]["nodes"][1]["model"]["fuse"] = True
    assert parse_args(graph_file).fused_nodes == frozenset({"add"})


def test_a_decorated_class_stays_a_deployment(tmp_path, monkeypatch, observer):
    (tmp_path / "decorated_fused.py").write_text(
        "from ray import serve\n"
        "@serve.deployment(ray_actor_options={'num_cpus': 2})\n"
        "class Heavy:\n"
        "    def __call__(self, doc):\n"
        "        return doc\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    nodes = [{"name": "heavy", "model": {"import_path": "decorated_fused:Heavy"}}]
    bound, _ = bind_models(parse_args(args_of(nodes, chain(*nodes))))
    assert set(bound) == {"heavy"}
