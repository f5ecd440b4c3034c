"""Parsing the application's args: the configs raypipe renders for the sample graphs
(fixtures/rendered, kept equal to `raypipe dag render --json` by tests/integration/runtime.rs),
and clear errors, naming the field, for args the runtime cannot run."""

import copy

import pytest
from conftest import SAMPLES, rendered, rendered_args

from raypipe_runtime.spec import API_VERSION, ArgsError, parse_args


@pytest.mark.parametrize("name", SAMPLES)
def test_rendered_samples_parse(name):
    config = rendered(name)
    (app,) = config["applications"]
    assert app["import_path"] == "raypipe_runtime.app:build"
    args = parse_args(app["args"])
    assert args.api_version == API_VERSION
    graph = args.graph
    # Every model node is a deployment the config names; so is the executor.
    deployment_names = {d["name"] for d in app["deployments"]}
    assert deployment_names == {n.name for n in graph.model_nodes()} | {args.executor_deployment}
    assert graph.order[0] == graph.ingress and graph.order[-1] == graph.output


def test_ensemble_args_in_detail():
    graph = parse_args(rendered_args("ensemble")).graph
    assert graph.deadline_ms == 15000
    assert [n.name for n in graph.model_nodes()] == ["preprocess", "model_a", "model_b", "combine"]
    model_b = graph.nodes["model_b"]
    assert (model_b.on_error, model_b.timeout_ms, model_b.model.init_kwargs) == ("SKIP", 5000, {"label": "b"})
    into = {(e.source, e.target): (e.into, e.optional) for e in graph.edges}
    assert into[("model_a", "combine")] == ("/a", False)
    assert into[("model_b", "combine")] == ("/b", True)


def test_switch_canary_args_in_detail():
    graph = parse_args(rendered_args("switch-canary")).graph
    assert graph.nodes["canary"].sticky_key == "/request/user_id"
    assert graph.nodes["candidate"].fallback_value == {"label": "fallback", "score": 0.0}
    assert graph.nodes["response"].join == "ANY"
    assert graph.shadow == {"audit"}
    weights = {e.target: e.weight for e in graph.out_edges["canary"]}
    assert weights == {"stable": 90, "candidate": 10}


def test_sequence_args_in_detail():
    graph = parse_args(rendered_args("sequence")).graph
    retry = graph.nodes["classify"].retry
    assert (retry.attempts, retry.retry_on) == (2, {"UNAVAILABLE", "BACKPRESSURE"})
    assert graph.forward_headers == ("x-request-id",)


def problems_of(args):
    with pytest.raises(ArgsError) as caught:
        parse_args(args)
    return dict(caught.value.problems), str(caught.value)


def test_wrong_api_version_is_named():
    args = rendered_args("sequence")
    args["api_version"] = "raypipe.v0"
    problems, text = problems_of(args)
    assert "args.api_version" in problems
    assert "raypipe.v1" in text


def test_errors_name_the_field():
    args = copy.deepcopy(rendered_args("ensemble"))
    graph = args["graph"]
    graph["nodes"][2]["model"]["import_path"] = "not a path"
    graph["nodes"][3]["on_error"] = "EXPLODE"
    graph["edges"][0]["target"] = "nowhere"
    graph["edges"][1]["colour"] = "blue"
    graph["nodes"][1]["timeout_ms"] = -1
    problems, text = problems_of(args)
    assert 'args.graph.nodes[2] ("model_a").model.import_path' in problems
    assert 'args.graph.nodes[3] ("model_b").on_error' in problems
    assert "args.graph.edges[0].target" in problems
    assert "args.graph.edges[1].colour" in problems
    assert 'args.graph.nodes[1] ("preprocess").timeout_ms' in problems
    assert "5 problem(s)" in text


def test_structural_problems_are_refused():
    args = copy.deepcopy(rendered_args("sequence"))
    graph = args["graph"]
    graph["edges"].append({"source": "classify", "target": "preprocess"})
    problems, _ = problems_of(args)
    assert any("cycle" in message for message in problems.values())

    args = copy.deepcopy(rendered_args("switch-canary"))
    del args["graph"]["edges"][3]["weight"]
    problems, _ = problems_of(args)
    assert "args.graph.edges[3].weight" in problems

    args = copy.deepcopy(rendered_args("switch-canary"))
    args["graph"]["edges"][1]["when"] = {"compare": {"path": "/request/tier", "op": "GT", "value": True}}
    problems, _ = problems_of(args)
    assert "args.graph.edges[1].when.compare.value" in problems


def test_missing_args_are_explained():
    problems, _text = problems_of(None)
    assert "args" in problems
    problems, _ = problems_of({"api_version": "raypipe.v1", "executor_deployment": "x"})
    assert "args.graph" in problems


def test_executor_name_must_not_be_a_model():
    args = copy.deepcopy(rendered_args("sequence"))
    args["executor_deployment"] = "classify"
    problems, _ = problems_of(args)
    assert "args.executor_deployment" in problems
