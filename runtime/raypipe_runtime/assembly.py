"""A node's input: the document assembled from its upstream outputs (edge selections, tensor
lists, `into` pointers, the node's input template, `if_missing` fills), and the arguments a
model node is called with. Pure functions of the values settled so far."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from . import pointer as jp
from .errors import GraphError
from .spec import MISSING, EdgeSpec, GraphSpec, NodeSpec


class _Dead:
    pass


# What `take` returns for an optional edge whose selection does not resolve: the edge is dead.
DEAD = _Dead()


def assemble(
    node: NodeSpec, live: list[EdgeSpec], dead_optional: list[EdgeSpec], values: Mapping[str, Any], ingress: str
) -> Any:
    """The input document of `node`, fired with its `live` in-edges; `dead_optional` are its
    dead optional in-edges, which write their `if_missing` value when they have one."""
    data = [e for e in live if e.mode == "DATA"]
    fills = [e for e in dead_optional if e.mode == "DATA" and e.if_missing is not MISSING]
    if (
        node.input_template is MISSING
        and len(data) == 1
        and data[0].into == ""
        and data[0].tensors is None
        and not fills
    ):
        return take(node, data[0], values, ingress)
    document = copy.deepcopy(node.input_template) if node.input_template is not MISSING else {}
    writers = sorted([(e, True) for e in data] + [(e, False) for e in fills], key=lambda p: p[0].index)
    for e, is_live in writers:
        if not is_live:
            if e.tensors is not None:
                continue
            value = copy.deepcopy(e.if_missing)
        else:
            value = take(node, e, values, ingress)
        if e.tensors is not None and is_live:
            document = _append_tensors(node, e, document, value)
            continue
        try:
            document = jp.write(document, e.into, value)
        except ValueError as exc:
            raise GraphError("NODE_INPUT", node.name, f"edge {e.label}: {exc}") from None
    return document


def take(node: NodeSpec, e: EdgeSpec, values: Mapping[str, Any], ingress: str) -> Any:
    """What edge `e` carries into `node`: its source's output, its `select`ion or its tensors;
    DEAD when an optional edge's selection does not resolve."""
    value = values[e.source]
    if e.tensors is not None:
        tensors = []
        outputs = value.get("outputs") if isinstance(value, dict) else None
        for tensor_name in e.tensors.names:
            found = None
            if isinstance(outputs, list):
                found = next((t for t in outputs if isinstance(t, dict) and t.get("name") == tensor_name), None)
            if found is None:
                if e.optional:
                    return DEAD
                raise GraphError(
                    _select_code(e, ingress),
                    node.name,
                    f"edge {e.label}: output tensor {tensor_name!r} of {e.source} is missing",
                )
            renamed = dict(found)
            renamed["name"] = e.tensors.rename.get(tensor_name, tensor_name)
            tensors.append(renamed)
        return tensors
    if not e.select:
        return value
    try:
        found = jp.lookup(value, e.select)
    except jp.RawBodyError:
        raise GraphError(
            "INVALID_INPUT", node.name, f"edge {e.label} selects {e.select} but the request body is not JSON"
        ) from None
    if found is jp.MISSING:
        if e.optional:
            return DEAD
        raise GraphError(
            _select_code(e, ingress), node.name, f"edge {e.label}: {e.select} is not in the output of {e.source}"
        )
    return found


def _select_code(e: EdgeSpec, ingress: str) -> str:
    """A missing selection from the request itself is the client's error."""
    return "INVALID_INPUT" if e.source == ingress else "SELECT_MISSING"


def _append_tensors(node: NodeSpec, e: EdgeSpec, document: Any, tensors: list) -> Any:
    if not isinstance(document, dict):
        raise GraphError("NODE_INPUT", node.name, f"edge {e.label}: tensors need an object document")
    inputs = document.setdefault("inputs", [])
    if not isinstance(inputs, list):
        raise GraphError("NODE_INPUT", node.name, f"edge {e.label}: /inputs of the document is not a list")
    inputs.extend(tensors)
    return document


def call_args(node: NodeSpec, document: Any, graph: GraphSpec, headers: Mapping[str, str] | None) -> tuple[tuple, dict]:
    """The positional and keyword arguments of a model node's call: the document itself
    (SINGLE_ARG) or its keys (KWARGS), plus `headers=` (a copy of `headers`) when given."""
    assert node.model is not None  # only model nodes are called
    kwargs: dict[str, Any] = {}
    args: tuple
    if node.model.call_style == "KWARGS":
        if not isinstance(document, dict) or not all(isinstance(k, str) and k.isidentifier() for k in document):
            code = (
                "INVALID_INPUT" if any(e.source == graph.ingress for e in graph.in_edges[node.name]) else "NODE_INPUT"
            )
            raise GraphError(
                code,
                node.name,
                f"{node.name} takes keyword arguments, but its input is not an object with identifier keys",
            )
        args, kwargs = (), dict(document)
    else:
        args = (document,)
    if headers is not None:
        kwargs["headers"] = dict(headers)
    return args, kwargs
