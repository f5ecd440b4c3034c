"""Predicates: parsing of the text form, static checks, and evaluation.

Follows raypipe's Rust evaluator (src/graph/predicate.rs) exactly; both run the shared vectors in
tests/vectors/predicates.json. Evaluation is total: a path that does not resolve or a value of
the wrong type makes a comparison false, and nothing ever fails (except reading inside a request
body that is not JSON, which the executor reports as INVALID_INPUT).

- EXISTS: the path resolves (null included).
- EQ / NE: the path resolves and the value is (not) deep-equal to the literal. Numbers compare by
  exact value (1 == 1.0; Python compares int and float exactly); booleans are not numbers.
- LT / LE / GT / GE: both numbers or both strings (by code point); else false.
- IN: deep-equal to some element of the literal array.
- CONTAINS: a string contains the literal string, or an array has an element equal to it.
- PREFIX: a string starts with the literal string.
- GLOB: whole-string match by code point; '*' any run, '?' one code point, all else literal.
- TRUTHY: resolves and is not null, false, 0, "", [] or {}.
- all_of / any_of / negate; some / every over an array, inner paths relative to the element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import pointer as jp

MAX_PREDICATE_NODES = 64
MAX_PREDICATE_DEPTH = 8

OPS = (
    "EXISTS",
    "EQ",
    "NE",
    "LT",
    "LE",
    "GT",
    "GE",
    "IN",
    "CONTAINS",
    "PREFIX",
    "GLOB",
    "TRUTHY",
)
_OP_NUMBERS = {i + 1: op for i, op in enumerate(OPS)}


@dataclass(frozen=True)
class Compare:
    path: str
    op: str
    value: Any = None
    has_value: bool = False


@dataclass(frozen=True)
class AllOf:
    items: tuple


@dataclass(frozen=True)
class AnyOf:
    items: tuple


@dataclass(frozen=True)
class Negate:
    inner: Any


@dataclass(frozen=True)
class Some:
    path: str
    inner: Any


@dataclass(frozen=True)
class Every:
    path: str
    inner: Any


class PredicateError(ValueError):
    """A predicate the runtime refuses; `problems` is a list of (at, message)."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(f"{at or '(predicate)'}: {msg}" for at, msg in self.problems))


def _join(prefix: str, part: str) -> str:
    return f"{prefix}.{part}" if prefix else part


def parse_op(value) -> str | None:
    """An Op from its text form: "EQ", "OP_EQ", "eq", or its number; None when unknown."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return _OP_NUMBERS.get(value)
    if isinstance(value, str):
        name = value.strip().upper()
        if name.startswith("OP_"):
            name = name[3:]
        return name if name in OPS else None
    return None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_name(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if _is_number(v):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _finite(v) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    return True


class _Parser:
    def __init__(self):
        self.problems = []
        self.nodes = 0
        self.too_deep = False
        self.scoped_paths = []

    def problem(self, at, message):
        self.problems.append((at, message))

    def parse(self, obj, at: str, depth: int, top_level: bool):
        self.nodes += 1
        if self.nodes > MAX_PREDICATE_NODES:
            return None
        if depth > MAX_PREDICATE_DEPTH:
            if not self.too_deep:
                self.too_deep = True
                self.problem(at, f"nests deeper than {MAX_PREDICATE_DEPTH} levels")
            return None
        if not isinstance(obj, dict) or len(obj) != 1:
            self.problem(
                at,
                "is empty or has several keys: set exactly one of compare, all_of, any_of, negate, some, every",
            )
            return None
        ((key, body),) = obj.items()
        if key == "compare":
            return self.compare(body, _join(at, "compare"), top_level)
        if key in ("all_of", "any_of"):
            where = _join(at, key)
            items = body.get("items") if isinstance(body, dict) and set(body) <= {"items"} else body
            if items is None:
                items = []
            if not isinstance(items, list):
                self.problem(where, "must be a list of predicates")
                return None
            if not items:
                self.problem(where, "is an empty list; give at least one predicate")
            parsed = tuple(self.parse(item, f"{where}[{i}]", depth + 1, top_level) for i, item in enumerate(items))
            return (AllOf if key == "all_of" else AnyOf)(parsed)
        if key == "negate":
            return Negate(self.parse(body, _join(at, "negate"), depth + 1, top_level))
        if key in ("some", "every"):
            where = _join(at, key)
            if not isinstance(body, dict):
                self.problem(where, "must be an object with path and inner")
                return None
            unknown = set(body) - {"path", "inner"}
            if unknown:
                self.problem(where, f"unknown keys {sorted(unknown)}")
            path = body.get("path", "")
            self.path(path, f"{where}.path", top_level)
            if body.get("inner") is None:
                self.problem(where, "has no inner predicate")
                inner = None
            else:
                inner = self.parse(body["inner"], f"{where}.inner", depth + 1, False)
            return (Some if key == "some" else Every)(path if isinstance(path, str) else "", inner)
        self.problem(at, f"unknown predicate form {key!r}: use compare, all_of, any_of, negate, some or every")
        return None

    def path(self, path, at, top_level):
        if not isinstance(path, str):
            self.problem(at, "must be a string (a JSON Pointer)")
            return
        try:
            jp.check(path)
        except jp.PointerError as e:
            self.problem(at, f"path {path!r} is not a JSON Pointer: {e}")
            return
        if top_level:
            if path == "":
                self.problem(at, 'path is empty; start it with the ingress or a node name, e.g. "/request/field"')
            else:
                self.scoped_paths.append((at, path))

    def compare(self, body, at, top_level):
        if not isinstance(body, dict):
            self.problem(at, "must be an object with path, op and value")
            return None
        unknown = set(body) - {"path", "op", "value"}
        if unknown:
            self.problem(at, f"unknown keys {sorted(unknown)}")
        path = body.get("path", "")
        self.path(path, f"{at}.path", top_level)
        has_value = "value" in body
        value = body.get("value")
        value_at = f"{at}.value"
        if has_value and not _finite(value):
            self.problem(value_at, "contains a number that is not finite")
        raw_op = body.get("op")
        op = parse_op(raw_op)
        if (
            raw_op is None
            or raw_op == 0
            or (isinstance(raw_op, str) and raw_op.strip().upper() in ("UNSPECIFIED", "OP_UNSPECIFIED"))
        ):
            self.problem(
                f"{at}.op", "is not set; choose EXISTS, EQ, NE, LT, LE, GT, GE, IN, CONTAINS, PREFIX, GLOB or TRUTHY"
            )
            return None
        if op is None:
            self.problem(f"{at}.op", f"{raw_op!r} is not a known operator")
            return None
        name = op.lower()
        if op in ("EXISTS", "TRUTHY"):
            if has_value:
                self.problem(value_at, f"{name} takes no value; remove it")
        elif not has_value:
            self.problem(value_at, f"{name} needs a value")
        elif op in ("LT", "LE", "GT", "GE") and not (_is_number(value) or isinstance(value, str)):
            self.problem(value_at, f"{name} compares numbers or strings, not {_type_name(value)}")
        elif op == "IN" and not isinstance(value, list):
            self.problem(value_at, f"in needs an array of options, not {_type_name(value)}")
        elif op in ("PREFIX", "GLOB") and not isinstance(value, str):
            self.problem(value_at, f"{name} needs a string, not {_type_name(value)}")
        return Compare(path if isinstance(path, str) else "", op, value, has_value)


def parse(obj):
    """Parses the text form of a predicate; raises PredicateError listing every problem (with
    the same `at` locations as the Rust checker). Returns (predicate, top-level scoped paths)."""
    parser = _Parser()
    parsed = parser.parse(obj, "", 1, True)
    if parser.nodes > MAX_PREDICATE_NODES:
        parser.problem(
            "",
            f"has {parser.nodes} predicate nodes, more than the limit of {MAX_PREDICATE_NODES}; "
            "move the logic into a model node",
        )
    if parser.problems:
        raise PredicateError(parser.problems)
    return parsed, [p for _, p in parser.scoped_paths]


# ---------------------------------------------------------------------------------------------
# Evaluation


def truthy(v) -> bool:
    if v is None:
        return False
    if isinstance(v, bool):
        return v
    if _is_number(v):
        return v != 0
    if isinstance(v, (str, list, dict)):
        return len(v) > 0
    return True


def json_eq(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return _order(a, b) == 0
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_eq(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return len(a) == len(b) and all(k in b and json_eq(v, b[k]) for k, v in a.items())
    return False


def _order(a, b) -> int | None:
    """-1 / 0 / 1 for two numbers (exact, as Python compares int and float) or two strings (by
    code point); None for anything else (or NaN)."""
    if _is_number(a) and _is_number(b):
        if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
            return None
    elif not (isinstance(a, str) and isinstance(b, str)):
        return None
    return -1 if a < b else (1 if a > b else 0)


def glob_match(pattern: str, text: str) -> bool:
    """Whole-string glob by code point; linear backtracking to the last star."""
    p, t = pattern, text
    pi = ti = 0
    star = None
    while ti < len(t):
        if pi < len(p) and (p[pi] == "?" or (p[pi] != "*" and p[pi] == t[ti])):
            pi += 1
            ti += 1
        elif pi < len(p) and p[pi] == "*":
            star = (pi, ti)
            pi += 1
        elif star is not None:
            sp, st = star
            pi = sp + 1
            ti = st + 1
            star = (sp, st + 1)
        else:
            return False
    return all(c == "*" for c in p[pi:])


def evaluate(predicate, scope) -> bool:
    """Evaluates a parsed predicate against a scope ({ingress: request, node: output, ...})."""
    if predicate is None:
        return False
    if isinstance(predicate, Compare):
        return _compare(predicate, scope)
    if isinstance(predicate, AllOf):
        return all(evaluate(p, scope) for p in predicate.items)
    if isinstance(predicate, AnyOf):
        return any(evaluate(p, scope) for p in predicate.items)
    if isinstance(predicate, Negate):
        return not evaluate(predicate.inner, scope)
    if isinstance(predicate, (Some, Every)):
        items = jp.lookup(scope, predicate.path)
        if not isinstance(items, list) or predicate.inner is None:
            return False
        test = any if isinstance(predicate, Some) else all
        return test(evaluate(predicate.inner, item) for item in items)
    return False


def _compare(c: Compare, scope) -> bool:
    actual = jp.lookup(scope, c.path)
    if actual is jp.MISSING:
        return False
    op = c.op
    if op == "EXISTS":
        return True
    if op == "TRUTHY":
        return truthy(actual)
    if not c.has_value:
        return False
    lit = c.value
    if op == "EQ":
        return json_eq(actual, lit)
    if op == "NE":
        return not json_eq(actual, lit)
    if op in ("LT", "LE", "GT", "GE"):
        o = _order(actual, lit)
        if o is None:
            return False
        return {"LT": o < 0, "LE": o <= 0, "GT": o > 0, "GE": o >= 0}[op]
    if op == "IN":
        return isinstance(lit, list) and any(json_eq(actual, o) for o in lit)
    if op == "CONTAINS":
        if isinstance(actual, str) and isinstance(lit, str):
            return lit in actual
        if isinstance(actual, list):
            return any(json_eq(item, lit) for item in actual)
        return False
    if op == "PREFIX":
        return isinstance(actual, str) and isinstance(lit, str) and actual.startswith(lit)
    if op == "GLOB":
        return isinstance(actual, str) and isinstance(lit, str) and glob_match(lit, actual)
    return False
