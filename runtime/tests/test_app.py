"""The Serve builder without a cluster: what it binds, and errors naming the node's field."""

import copy
import os

import pytest
from conftest import rendered_args

try:
    from ray import serve  # noqa: F401 (importing it is the check that Ray is here)
    from ray.serve.deployment import Application
except ImportError:  # pragma: no cover
    if os.environ.get("RAYPIPE_REQUIRE_RAY") == "1":
        raise
    pytest.skip("ray[serve] is not installed in this interpreter", allow_module_level=True)

from raypipe_runtime.app import bind_models, build, encode_result, parse_body
from raypipe_runtime.engine import Result
from raypipe_runtime.pointer import RawBody
from raypipe_runtime.spec import ArgsError, parse_args


def test_build_binds_one_deployment_per_model_node_named_after_it():
    app = build(rendered_args("ensemble"))
    assert isinstance(app, Application)
    bound, header_nodes = bind_models(parse_args(rendered_args("ensemble")))
    assert set(bound) == {"preprocess", "model_a", "model_b", "combine"}
    assert {name: b._bound_deployment.name for name, b in bound.items()} == {n: n for n in bound}
    assert bound["model_a"]._bound_deployment._replica_config.init_kwargs == {"label": "a"}
    assert header_nodes == []


def test_decorated_classes_keep_their_options(tmp_path, monkeypatch):
    (tmp_path / "decorated_models.py").write_text(
        "from ray import serve\n"
        "@serve.deployment(max_ongoing_requests=7)\n"
        "class Scorer:\n"
        "    def predict(self, doc, headers=None):\n"
        "        return doc\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = copy.deepcopy(rendered_args("sequence"))
    node = args["graph"]["nodes"][2]
    node["model"] = {"import_path": "decorated_models:Scorer", "method": "predict"}
    bound, header_nodes = bind_models(parse_args(args))
    deployment = bound["classify"]._bound_deployment
    assert (deployment.name, deployment.max_ongoing_requests) == ("classify", 7)
    assert header_nodes == ["classify"]  # declares `headers` and the graph forwards x-request-id


def test_import_problems_name_the_node():
    args = copy.deepcopy(rendered_args("ensemble"))
    args["graph"]["nodes"][2]["model"]["import_path"] = "samples.models:Nope"
    args["graph"]["nodes"][4]["model"]["import_path"] = "no_such_package.models:Combine"
    args["graph"]["nodes"][1]["model"]["method"] = "missing_method"
    with pytest.raises(ArgsError) as caught:
        build(args)
    problems = dict(caught.value.problems)
    assert "Nope" in problems['args.graph.nodes[2] ("model_a").model.import_path']
    assert "no_such_package" in problems['args.graph.nodes[4] ("combine").model.import_path']
    assert "missing_method" in problems['args.graph.nodes[1] ("preprocess").model.method']


def test_bodies():
    assert parse_body(b"") is None
    assert parse_body(b'{"a": 1}') == {"a": 1}
    assert isinstance(parse_body(b"plain"), RawBody)
    status, content, media, _ = encode_result(Result(200, {"x": [1, 2]}))
    assert (status, content, media) == (200, b'{"x": [1, 2]}', "application/json")
    status, content, _, _ = encode_result(Result(200, {1, 2}))
    assert status == 500 and b"not JSON" in content
