"""The shared predicate vectors (tests/vectors): the runtime answers exactly as raypipe's Rust
evaluator (src/graph/predicate.rs) does on the same files."""

import json

import pytest
from conftest import VECTORS

from raypipe_runtime import pointer as jp
from raypipe_runtime import predicate as P

VALID = json.loads((VECTORS / "predicates.json").read_text())
INVALID = json.loads((VECTORS / "predicates_invalid.json").read_text())


def test_the_vectors_stay_broad():
    assert len(VALID["cases"]) >= 80
    assert len(INVALID["cases"]) >= 5


@pytest.mark.parametrize("case", VALID["cases"], ids=lambda c: c["name"])
def test_predicate_vector(case):
    predicate, _ = P.parse(case["predicate"])
    assert P.evaluate(predicate, VALID["scope"]) is case["expected"]


@pytest.mark.parametrize("case", INVALID["cases"], ids=lambda c: c["name"])
def test_invalid_predicate_vector(case):
    with pytest.raises(P.PredicateError) as caught:
        P.parse(case["predicate"])
    assert sorted({at for at, _ in caught.value.problems}) == sorted(set(case["problems"]))


def test_enum_spellings_are_accepted():
    for op in ("EQ", "OP_EQ", "eq", 2):
        predicate, _ = P.parse({"compare": {"path": "/request/x", "op": op, "value": 1}})
        assert P.evaluate(predicate, {"request": {"x": 1.0}})


def test_glob_stays_linear():
    assert not P.glob_match("*a" * 50 + "b", "a" * 5000)


def test_pointer_rules():
    doc = {"a/b": 1, "m~n": 2, "list": [10, 20], "x": {"y": None}}
    assert jp.resolve(doc, "/a~1b") == 1
    assert jp.resolve(doc, "/m~0n") == 2
    assert jp.resolve(doc, "/list/1") == 20
    assert jp.lookup(doc, "/list/01") is jp.MISSING
    assert jp.lookup(doc, "/list/-") is jp.MISSING
    assert jp.lookup(doc, "/x/y") is None
    assert jp.resolve(doc, "") is doc
    assert jp.write(None, "/a/b", 1) == {"a": {"b": 1}}
    assert jp.write({"inputs": []}, "/inputs/-", 3) == {"inputs": [3]}
    with pytest.raises(jp.RawBodyError):
        jp.lookup({"request": jp.RawBody("not json")}, "/request/x")
