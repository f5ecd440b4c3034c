"""The sample graphs with the sample models (samples/models.py) called in-process: the answers
documented in samples/graphs/README.md."""

import random

import pytest
from conftest import rendered_args, run

from raypipe_runtime.app import import_attr
from raypipe_runtime.engine import Executor, sticky_choice
from raypipe_runtime.spec import parse_args

TEXT = {"text": "I LOVE this  great product"}


def executor(name, rng=None):
    spec = parse_args(rendered_args(name))
    callers = {}
    for node in spec.graph.model_nodes():
        cls = import_attr(node.model.import_path)
        instance = cls(*node.model.init_args, **node.model.init_kwargs)
        method = getattr(instance, node.model.method)

        async def call(*args, _method=method, **kwargs):
            return _method(*args, **kwargs)

        callers[node.name] = call
    return Executor(spec.graph, callers, rng=rng or random.Random(7))


def test_sequence():
    result = run(executor("sequence").run(TEXT))
    assert (result.status, result.body) == (200, {"label": "stable", "score": 0.7, "positive": True})


def test_ensemble():
    result = run(executor("ensemble").run(TEXT))
    assert result.status == 200
    assert result.body == {"score": 0.7, "votes": {"a": 0.7, "b": 0.7}}
    assert "x-raypipe-partial" not in result.headers


def test_ensemble_survives_model_b_failing():
    result = run(executor("ensemble").run({"text": "good product fail:b"}))
    assert result.status == 200
    assert result.body == {"score": 0.6667, "votes": {"a": 0.6667}}
    assert result.headers["x-raypipe-partial"] == "model_b"


def test_ensemble_fails_with_model_a():
    result = run(executor("ensemble").run({"text": "fail:a"}))
    assert result.status == 502
    assert result.body["error"]["node"] == "model_a"
    assert "classifier a was asked to fail" in result.body["error"]["message"]


def test_switch_canary_gold_goes_to_premium():
    result = run(executor("switch-canary").run({"tier": "gold", "user_id": "u1", **TEXT}))
    assert result.body == {"label": "premium", "score": 0.7, "positive": True}
    assert result.headers["x-raypipe-route"] == "tier=premium"


@pytest.mark.parametrize("user", ["u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"])
def test_switch_canary_split_is_sticky(user):
    expected = "stable" if sticky_choice(user, 100) < 90 else "candidate"
    for seed in range(3):
        result = run(executor("switch-canary", random.Random(seed)).run({"tier": "free", "user_id": user, **TEXT}))
        assert result.status == 200
        assert result.body["label"] == expected
        assert result.headers["x-raypipe-route"] == f"tier=canary,canary={expected}"


def test_switch_canary_candidate_falls_back():
    # Find a user the sticky split sends to the candidate, then make the candidate fail.
    user = next(f"u{i}" for i in range(1000) if sticky_choice(f"u{i}", 100) >= 90)
    result = run(executor("switch-canary").run({"tier": "free", "user_id": user, "text": "fail:candidate"}))
    assert result.status == 200
    assert result.body == {"label": "fallback", "score": 0.0}
    assert result.headers["x-raypipe-fallback"] == "candidate"


def test_documented_candidate_user():
    assert sticky_choice("u1", 100) < 90 <= sticky_choice("u11", 100)
    result = run(executor("switch-canary").run({"tier": "free", "user_id": "u11", **TEXT}))
    assert result.body["label"] == "candidate"
