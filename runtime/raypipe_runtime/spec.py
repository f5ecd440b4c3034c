"""The application's `args` (contract "raypipe.v1", written by raypipe's src/serve/config.rs):

    api_version: "raypipe.v1"
    executor_deployment: <name of the ingress deployment that runs the graph>
    graph: <the pipeline in the text form of proto/raypipe/v1/pipeline.proto, wiring only>
    fused_nodes: [<model node names>]   # optional: run in-process in the executor (src/serve/fuse.rs)

With shared node applications (src/serve/shared.rs) a version application's args are instead

    api_version: "raypipe.v1"
    executor_deployment: <name>
    wiring: "user_config"
    fused: [<the fused nodes' definitions>]   # built into the executor: one keyed unit

and the graph arrives in the executor's `user_config` (applied in place by Serve):

    raypipe: {graph: <as above>, fused_nodes: [<names>], node_applications: {<node>: <app>}}

while each model node is an application of its own (node_app.py) with the args

    api_version: "raypipe.node.v1"
    node: <node name, the deployment's name>
    model: {import_path, init_args, init_kwargs}

Parsing is strict, like raypipe's own reader: unknown keys, wrong types, dangling edges and the
like are refused with every problem listed, each naming its field (`graph.edges[3].target`).
Raypipe validates graphs fully before rendering; these checks keep the runtime from ever
running something it does not understand (a newer writer, a hand-written config).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import Any

from . import pointer as jp
from . import predicate as pred

API_VERSION = "raypipe.v1"
NODE_API_VERSION = "raypipe.node.v1"
WIRING_IN_USER_CONFIG = "user_config"
WIRING_KEY = "raypipe"
DEFAULT_DEADLINE_MS = 30_000
MAX_DEADLINE_MS = 3_600_000
DEFAULT_INITIAL_BACKOFF_MS = 50
DEFAULT_MAX_BACKOFF_MS = 2_000

MISSING = jp.MISSING  # "key absent" for JSON-valued fields where null is a value

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_IMPORT_PATH = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?$"
)
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

KINDS = ("input", "model", "switch", "split", "output")
JOIN_MODES = ("ALL", "ANY")
ON_ERRORS = ("FAIL", "SKIP", "FALLBACK")
CALL_STYLES = ("SINGLE_ARG", "KWARGS")
NO_MATCHES = ("UNSPECIFIED", "ERROR", "SKIP")
EDGE_MODES = ("DATA", "ORDER")
RETRY_ONS = ("UNSPECIFIED", "UNAVAILABLE", "BACKPRESSURE", "TIMEOUT", "APP_ERROR")


class ArgsError(ValueError):
    """The application's args are not a graph this runtime can run. `problems` lists
    (field, message) pairs; the message names every one."""

    def __init__(self, problems):
        self.problems = list(problems)
        lines = "\n".join(f"  - {where}: {message}" for where, message in self.problems)
        super().__init__(f"raypipe runtime: invalid application args ({len(self.problems)} problem(s)):\n{lines}")


@dataclass(frozen=True)
class RetrySpec:
    attempts: int = 1
    initial_backoff_ms: int = DEFAULT_INITIAL_BACKOFF_MS
    max_backoff_ms: int = DEFAULT_MAX_BACKOFF_MS
    retry_on: frozenset = frozenset()


@dataclass(frozen=True)
class TensorSpec:
    names: tuple
    rename: dict


@dataclass
class EdgeSpec:
    index: int
    source: str
    target: str
    mode: str = "DATA"
    select: str = ""
    tensors: TensorSpec | None = None
    into: str = ""
    optional: bool = False
    if_missing: Any = MISSING
    when: Any = None
    weight: int | None = None
    order: int = 0

    @property
    def label(self) -> str:
        return f"{self.source}->{self.target}"


@dataclass
class ModelSpec:
    import_path: str
    init_args: list = field(default_factory=list)
    init_kwargs: dict = field(default_factory=dict)
    method: str = "__call__"
    call_style: str = "SINGLE_ARG"


@dataclass
class NodeSpec:
    name: str
    kind: str
    model: ModelSpec | None = None
    on_no_match: str = "UNSPECIFIED"
    sticky_key: str = ""
    join: str = "ALL"
    on_error: str = "FAIL"
    fallback_value: Any = MISSING
    timeout_ms: int = 0
    retry: RetrySpec = field(default_factory=RetrySpec)
    shadow_percent: int | None = None
    input_template: Any = MISSING


@dataclass
class GraphSpec:
    name: str
    version: str
    ingress: str
    nodes: dict  # name -> NodeSpec, declaration order
    edges: list
    deadline_ms: int
    forward_headers: tuple
    labels: dict
    output: str = ""
    in_edges: dict = field(default_factory=dict)
    out_edges: dict = field(default_factory=dict)
    order: list = field(default_factory=list)  # topological, ties by declaration
    ancestors: dict = field(default_factory=dict)  # name -> frozenset of ancestor names
    shadow: frozenset = frozenset()  # shadow nodes and their exclusive descendants

    def model_nodes(self):
        return [n for n in self.nodes.values() if n.kind == "model"]


@dataclass
class RuntimeArgs:
    api_version: str
    executor_deployment: str
    graph: GraphSpec
    fused_nodes: frozenset = frozenset()  # model nodes that run in-process in the executor


class _Problems:
    def __init__(self):
        self.items = []

    def add(self, where, message):
        self.items.append((where, message))


def _enum(value, allowed, prefix, where, problems, default):
    if value is None:
        return default
    if isinstance(value, bool):
        problems.add(where, f"must be one of {', '.join(a for a in allowed if a != 'UNSPECIFIED')}, not {value!r}")
        return default
    if isinstance(value, int):
        if 0 <= value < len(allowed):
            return allowed[value]
        problems.add(where, f"enum value {value} is unknown")
        return default
    if isinstance(value, str):
        name = value.strip().upper()
        if name.startswith(prefix):
            name = name[len(prefix) :]
        if name in allowed:
            return name
    problems.add(
        where, f"unknown value {value!r} (expected one of {', '.join(a for a in allowed if a != 'UNSPECIFIED')})"
    )
    return default


def _keys(obj, allowed, where, problems) -> dict:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        problems.add(where, f"must be an object, not {pred._type_name(obj)}")
        return {}
    for key in obj:
        if key not in allowed:
            problems.add(f"{where}.{key}" if where else str(key), "unknown field (this runtime understands raypipe.v1)")
    return obj


def _str(obj, key, where, problems, default=""):
    value = obj.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        problems.add(f"{where}.{key}", f"must be a string, not {pred._type_name(value)}")
        return default
    return value


def _uint(obj, key, where, problems, default=0, maximum=None):
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.add(f"{where}.{key}", f"must be a whole number >= 0, not {value!r}")
        return default
    if maximum is not None and value > maximum:
        problems.add(f"{where}.{key}", f"is {value}, more than the limit of {maximum}")
        return default
    return value


def _pointer(obj, key, where, problems) -> str:
    value = _str(obj, key, where, problems)
    try:
        jp.check(value)
    except jp.PointerError as e:
        problems.add(f"{where}.{key}", f"{value!r} is not a JSON Pointer: {e}")
        return ""
    return value


def parse_args(args) -> RuntimeArgs:
    """Parses and checks the application's args; raises ArgsError naming every bad field."""
    problems = _Problems()
    top = (
        _keys(args, ("api_version", "executor_deployment", "graph", "fused_nodes"), "args", problems)
        if args is not None
        else {}
    )
    if args is None:
        problems.add("args", "is missing: the application needs the graph in its args")
    api_version = top.get("api_version")
    if api_version != API_VERSION:
        problems.add("args.api_version", f"is {api_version!r}; this runtime understands {API_VERSION!r}")
    executor = top.get("executor_deployment")
    if not isinstance(executor, str) or not _NAME.match(executor or ""):
        problems.add(
            "args.executor_deployment",
            f"is {executor!r}; it must name the executor deployment (1-63 of [A-Za-z0-9_.-])",
        )
        executor = "raypipe-executor"
    if "graph" not in top:
        if args is not None:
            problems.add("args.graph", "is missing")
        raise ArgsError(problems.items)
    graph = parse_graph(top["graph"], problems, "args.graph")
    if graph is not None and executor in graph.nodes and graph.nodes[executor].kind == "model":
        problems.add("args.executor_deployment", f"{executor!r} is also the name of a model node")
    fused = _fused_nodes(top.get("fused_nodes"), graph, problems)
    if problems.items:
        raise ArgsError(problems.items)
    # api_version is API_VERSION here: anything else is a problem above. `graph: null` still
    # gets here as None, naming no problem (as before the type check; it fails later, in build).
    return RuntimeArgs(
        api_version=API_VERSION,
        executor_deployment=executor,
        graph=graph,  # type: ignore[arg-type]
        fused_nodes=fused,
    )


def is_shared(args) -> bool:
    """Whether a version application's graph arrives in the executor's user_config."""
    return isinstance(args, dict) and args.get("wiring") == WIRING_IN_USER_CONFIG


@dataclass
class SharedArgs:
    """A version application's args with shared node applications."""

    executor_deployment: str
    fused: dict[str, NodeSpec]  # fused nodes by name, built into each executor replica
    fused_raw: dict[str, Any]  # their definitions as written, to compare with the wiring's


def parse_shared_args(args) -> SharedArgs:
    """Parses a version application's args with shared nodes; raises ArgsError."""
    problems = _Problems()
    top = _keys(args, ("api_version", "executor_deployment", "wiring", "fused"), "args", problems)
    if top.get("api_version") != API_VERSION:
        problems.add("args.api_version", f"is {top.get('api_version')!r}; this runtime understands {API_VERSION!r}")
    executor = top.get("executor_deployment")
    if not isinstance(executor, str) or not _NAME.match(executor):
        problems.add("args.executor_deployment", f"is {executor!r}; it must name the executor deployment")
        executor = "raypipe-executor"
    fused: dict[str, NodeSpec] = {}
    fused_raw: dict[str, Any] = {}
    raw_list = top.get("fused") or []
    if not isinstance(raw_list, list):
        problems.add("args.fused", "must be a list of node definitions")
        raw_list = []
    for i, raw in enumerate(raw_list):
        node = _parse_node(raw, f"args.fused[{i}]", problems)
        if node is None:
            continue
        if node.kind != "model":
            problems.add(f"args.fused[{i}]", f"{node.name!r} is not a model node")
        fused[node.name] = node
        fused_raw[node.name] = raw
    if problems.items:
        raise ArgsError(problems.items)
    return SharedArgs(executor_deployment=executor, fused=fused, fused_raw=fused_raw)


def parse_wiring(user_config, shared: SharedArgs) -> tuple[RuntimeArgs, dict[str, str]]:
    """The graph and the node applications from the executor's user_config, checked against
    the args it was built with; raises ArgsError."""
    problems = _Problems()
    where = f"user_config.{WIRING_KEY}"
    body = _keys(
        _keys(user_config, (WIRING_KEY,), "user_config", problems).get(WIRING_KEY),
        ("graph", "fused_nodes", "node_applications"),
        where,
        problems,
    )
    if problems.items:
        raise ArgsError(problems.items)
    runtime = parse_args(
        {
            "api_version": API_VERSION,
            "executor_deployment": shared.executor_deployment,
            "graph": body.get("graph"),
            "fused_nodes": body.get("fused_nodes"),
        }
    )
    if set(runtime.fused_nodes) != set(shared.fused):
        problems.add(
            f"{where}.fused_nodes",
            f"names {sorted(runtime.fused_nodes)}; this executor was built with {sorted(shared.fused)}",
        )
    raw_nodes = {n.get("name"): n for n in body["graph"].get("nodes", []) if isinstance(n, dict)}
    for name in sorted(set(runtime.fused_nodes) & set(shared.fused)):
        if raw_nodes.get(name) != shared.fused_raw[name]:
            problems.add(f"{where}.graph", f"fused node {name!r} differs from the one this executor was built with")
    apps = body.get("node_applications") or {}
    if not isinstance(apps, dict) or not all(isinstance(v, str) and _NAME.match(v) for v in apps.values()):
        problems.add(f"{where}.node_applications", "must map node names to application names")
        apps = {}
    served = {n.name for n in runtime.graph.model_nodes()} - set(runtime.fused_nodes)
    for name in sorted(served - set(apps)):
        problems.add(f"{where}.node_applications", f"names no application for node {name!r}")
    for name in sorted(set(apps) - served):
        problems.add(f"{where}.node_applications", f"names {name!r}, which is not a deployed model node")
    if problems.items:
        raise ArgsError(problems.items)
    return runtime, dict(apps)


def parse_node_args(args) -> tuple[str, ModelSpec]:
    """A node application's args: its node's name and model; raises ArgsError."""
    problems = _Problems()
    top = _keys(args, ("api_version", "node", "model"), "args", problems)
    if top.get("api_version") != NODE_API_VERSION:
        problems.add(
            "args.api_version", f"is {top.get('api_version')!r}; this runtime understands {NODE_API_VERSION!r}"
        )
    name = top.get("node")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.add("args.node", f"is {name!r}; it must name the node (1-63 of [A-Za-z0-9_.-])")
        name = ""
    model = _parse_model(top.get("model"), "args.model", problems)
    if problems.items:
        raise ArgsError(problems.items)
    return name, model


def _fused_nodes(value, graph: GraphSpec | None, problems: _Problems) -> frozenset:
    """`args.fused_nodes`: distinct names of model nodes of the graph (absent or null = none)."""
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        problems.add("args.fused_nodes", "must be a list of model node names")
        return frozenset()
    for i, name in enumerate(value):
        if name in value[:i]:
            problems.add(f"args.fused_nodes[{i}]", f"{name!r} is listed twice")
        elif graph is not None and (name not in graph.nodes or graph.nodes[name].kind != "model"):
            problems.add(f"args.fused_nodes[{i}]", f"{name!r} is not a model node of the graph")
    return frozenset(value)


def parse_graph_text(graph_obj) -> GraphSpec:
    """Parses just a graph (the `graph` member of args); raises ArgsError."""
    problems = _Problems()
    graph = parse_graph(graph_obj, problems, "graph")
    if problems.items:
        raise ArgsError(problems.items)
    return graph  # type: ignore[return-value]  # None for a null graph, as in parse_args


_GRAPH_KEYS = (
    "name",
    "version",
    "ingress",
    "nodes",
    "edges",
    "deadline_ms",
    "forward_headers",
    "labels",
    # Not part of the wiring raypipe renders into args, but part of the graph's text form:
    # accepted (and ignored) so a whole graph file can be given to the runtime too.
    "route_prefix",
    "runtime_env",
    "executor",
    "fuse",
)
_NODE_KEYS = (
    "name",
    "description",
    "join",
    "on_error",
    "fallback_value",
    "timeout_ms",
    "retry",
    "shadow",
    "input_template",
    *KINDS,
)


def parse_graph(obj, problems: _Problems, where: str) -> GraphSpec | None:
    g = _keys(obj, _GRAPH_KEYS, where, problems)
    if not isinstance(obj, dict):
        return None
    name = _str(g, "name", where, problems)
    version = _str(g, "version", where, problems)
    ingress = _str(g, "ingress", where, problems)
    deadline_ms = _uint(g, "deadline_ms", where, problems, 0, MAX_DEADLINE_MS) or DEFAULT_DEADLINE_MS
    headers = g.get("forward_headers") or []
    if not isinstance(headers, list) or not all(isinstance(h, str) and _HEADER.match(h) for h in headers):
        problems.add(f"{where}.forward_headers", "must be a list of HTTP header names")
        headers = []
    labels = g.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        problems.add(f"{where}.labels", "must map names to strings")
        labels = {}

    nodes: dict = {}
    raw_nodes = g.get("nodes") or []
    if not isinstance(raw_nodes, list):
        problems.add(f"{where}.nodes", "must be a list")
        raw_nodes = []
    for i, raw in enumerate(raw_nodes):
        node = _parse_node(raw, f"{where}.nodes[{i}]", problems)
        if node is None:
            continue
        if node.name in nodes:
            problems.add(f"{where}.nodes[{i}].name", f"{node.name!r} is declared twice")
            continue
        nodes[node.name] = node

    edges = []
    raw_edges = g.get("edges") or []
    if not isinstance(raw_edges, list):
        problems.add(f"{where}.edges", "must be a list")
        raw_edges = []
    for i, raw in enumerate(raw_edges):
        edge = _parse_edge(raw, i, f"{where}.edges[{i}]", problems, nodes)
        if edge is not None:
            edges.append(edge)

    graph = GraphSpec(
        name=name,
        version=version,
        ingress=ingress,
        nodes=nodes,
        edges=edges,
        deadline_ms=deadline_ms,
        forward_headers=tuple(h.lower() for h in headers),
        labels=dict(labels),
    )
    _check_structure(graph, problems, where)
    return graph


def _parse_node(raw, where, problems) -> NodeSpec | None:
    n = _keys(raw, _NODE_KEYS, where, problems)
    if not isinstance(raw, dict):
        return None
    name = n.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.add(
            f"{where}.name", f"is {name!r}; a node name is 1-63 of [A-Za-z0-9_.-], starting with a letter or digit"
        )
        return None
    where = f'{where} ("{name}")'
    kinds = [k for k in KINDS if k in n]
    if len(kinds) != 1:
        problems.add(where, f"must have exactly one kind ({', '.join(KINDS)}), has {kinds or 'none'}")
        return None
    kind = kinds[0]
    body = n.get(kind)
    node = NodeSpec(name=name, kind=kind)
    if kind in ("input", "output"):
        _keys(body, (), f"{where}.{kind}", problems)
    elif kind == "switch":
        s = _keys(body, ("on_no_match",), f"{where}.switch", problems)
        node.on_no_match = _enum(
            s.get("on_no_match"), NO_MATCHES, "NO_MATCH_", f"{where}.switch.on_no_match", problems, "UNSPECIFIED"
        )
    elif kind == "split":
        s = _keys(body, ("sticky_key",), f"{where}.split", problems)
        node.sticky_key = _pointer(s, "sticky_key", f"{where}.split", problems)
    else:
        node.model = _parse_model(body, f"{where}.model", problems)
    node.join = _enum(n.get("join"), JOIN_MODES, "JOIN_MODE_", f"{where}.join", problems, "ALL")
    node.on_error = _enum(n.get("on_error"), ON_ERRORS, "ON_ERROR_", f"{where}.on_error", problems, "FAIL")
    if "fallback_value" in n:
        node.fallback_value = n["fallback_value"]
    if node.on_error == "FALLBACK" and node.fallback_value is MISSING:
        problems.add(f"{where}.fallback_value", "is required with on_error FALLBACK")
    if node.on_error != "FALLBACK" and node.fallback_value is not MISSING:
        problems.add(f"{where}.fallback_value", "is only allowed with on_error FALLBACK")
    node.timeout_ms = _uint(n, "timeout_ms", where, problems, 0, MAX_DEADLINE_MS)
    if n.get("retry") is not None:
        node.retry = _parse_retry(n["retry"], f"{where}.retry", problems)
    if "shadow" in n:
        s = _keys(n["shadow"], ("sample_percent",), f"{where}.shadow", problems)
        percent = s.get("sample_percent", 100)
        if percent is None:
            percent = 100
        if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
            problems.add(f"{where}.shadow.sample_percent", f"is {percent!r}; it must be 1 to 100")
            percent = 100
        if kind != "model":
            problems.add(f"{where}.shadow", "is only allowed on model nodes")
        node.shadow_percent = percent
    if "input_template" in n:
        node.input_template = n["input_template"]
    return node


def _parse_model(body, where, problems) -> ModelSpec:
    # `deployment` and `fuse` are accepted (and ignored) like the graph-level keys above: which
    # nodes are fused is decided by the renderer and arrives as `args.fused_nodes`.
    m = _keys(
        body, ("import_path", "init_args", "init_kwargs", "method", "call_style", "deployment", "fuse"), where, problems
    )
    if m.get("fuse") is not None and not isinstance(m["fuse"], bool):
        problems.add(f"{where}.fuse", f"must be true or false, not {pred._type_name(m['fuse'])}")
    import_path = _str(m, "import_path", where, problems)
    if not _IMPORT_PATH.match(import_path) or (":" not in import_path and "." not in import_path):
        problems.add(f"{where}.import_path", f'is {import_path!r}; write "package.module:Class"')
    init_args = m.get("init_args") or []
    if not isinstance(init_args, list):
        problems.add(f"{where}.init_args", "must be a list")
        init_args = []
    init_kwargs = m.get("init_kwargs") or {}
    if not isinstance(init_kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in init_kwargs):
        problems.add(f"{where}.init_kwargs", "must map Python identifiers to values")
        init_kwargs = {}
    method = _str(m, "method", where, problems) or "__call__"
    if not method.isidentifier() or keyword.iskeyword(method):
        problems.add(f"{where}.method", f"{method!r} is not a Python method name")
    call_style = _enum(m.get("call_style"), CALL_STYLES, "CALL_STYLE_", f"{where}.call_style", problems, "SINGLE_ARG")
    return ModelSpec(import_path, list(init_args), dict(init_kwargs), method, call_style)


def _parse_retry(body, where, problems) -> RetrySpec:
    r = _keys(body, ("attempts", "initial_backoff_ms", "max_backoff_ms", "retry_on"), where, problems)
    attempts = _uint(r, "attempts", where, problems, 0) or 1
    if attempts > 10:
        problems.add(f"{where}.attempts", f"is {attempts}; at most 10")
        attempts = 10
    initial = _uint(r, "initial_backoff_ms", where, problems, 0) or DEFAULT_INITIAL_BACKOFF_MS
    maximum = _uint(r, "max_backoff_ms", where, problems, 0) or DEFAULT_MAX_BACKOFF_MS
    if maximum < initial:
        problems.add(f"{where}.max_backoff_ms", f"({maximum}) is below initial_backoff_ms ({initial})")
    raw_on = r.get("retry_on") or []
    if not isinstance(raw_on, list):
        problems.add(f"{where}.retry_on", "must be a list")
        raw_on = []
    retry_on = set()
    for i, item in enumerate(raw_on):
        value = _enum(item, RETRY_ONS, "RETRY_ON_", f"{where}.retry_on[{i}]", problems, "UNSPECIFIED")
        if value == "UNSPECIFIED":
            if item is not None and _enum(item, RETRY_ONS, "RETRY_ON_", "", _Problems(), None) == "UNSPECIFIED":
                problems.add(f"{where}.retry_on[{i}]", "UNSPECIFIED is not a failure class")
            continue
        retry_on.add(value)
    if attempts > 1 and not retry_on:
        problems.add(f"{where}.retry_on", "is required when attempts > 1")
    return RetrySpec(attempts, initial, maximum, frozenset(retry_on))


_EDGE_KEYS = (
    "source",
    "target",
    "mode",
    "select",
    "tensors",
    "into",
    "optional",
    "if_missing",
    "when",
    "weight",
    "order",
)


def _parse_edge(raw, index, where, problems, nodes) -> EdgeSpec | None:
    e = _keys(raw, _EDGE_KEYS, where, problems)
    if not isinstance(raw, dict):
        return None
    source = _str(e, "source", where, problems)
    target = _str(e, "target", where, problems)
    ok = True
    for key, name in (("source", source), ("target", target)):
        if name not in nodes:
            problems.add(f"{where}.{key}", f"{name!r} is not a node of the graph")
            ok = False
    edge = EdgeSpec(index=index, source=source, target=target)
    edge.mode = _enum(e.get("mode"), EDGE_MODES, "EDGE_MODE_", f"{where}.mode", problems, "DATA")
    edge.select = _pointer(e, "select", where, problems)
    edge.into = _pointer(e, "into", where, problems)
    if e.get("tensors") is not None:
        t = _keys(e["tensors"], ("names", "rename"), f"{where}.tensors", problems)
        names = t.get("names") or []
        rename = t.get("rename") or {}
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            problems.add(f"{where}.tensors.names", "must be a list of non-empty tensor names")
            names = []
        if not isinstance(rename, dict) or not all(isinstance(v, str) for v in rename.values()):
            problems.add(f"{where}.tensors.rename", "must map tensor names to names")
            rename = {}
        edge.tensors = TensorSpec(tuple(names), dict(rename))
        if edge.select:
            problems.add(f"{where}.tensors", "is an alternative to select; set only one")
    optional = e.get("optional", False)
    if not isinstance(optional, bool):
        problems.add(f"{where}.optional", "must be true or false")
        optional = False
    edge.optional = optional
    if "if_missing" in e:
        edge.if_missing = e["if_missing"]
        if not optional:
            problems.add(f"{where}.if_missing", "requires optional: true")
    if edge.mode == "ORDER" and (edge.select or edge.into or edge.tensors is not None):
        problems.add(where, "an ORDER edge carries no data: remove select, into and tensors")
    if e.get("when") is not None:
        try:
            edge.when, _ = pred.parse(e["when"])
        except pred.PredicateError as err:
            for at, message in err.problems:
                problems.add(f"{where}.when" + (f".{at}" if at else ""), message)
    if "weight" in e and e["weight"] is not None:
        edge.weight = _uint(e, "weight", where, problems, 0)
    edge.order = _uint(e, "order", where, problems, 0)
    return edge if ok else None


def _check_structure(graph: GraphSpec, problems: _Problems, where: str) -> None:
    nodes = graph.nodes
    inputs = [n.name for n in nodes.values() if n.kind == "input"]
    outputs = [n.name for n in nodes.values() if n.kind == "output"]
    if len(inputs) != 1:
        problems.add(f"{where}.nodes", f"must have exactly one input node, has {len(inputs)}")
    if graph.ingress not in nodes or nodes[graph.ingress].kind != "input":
        problems.add(f"{where}.ingress", f"is {graph.ingress!r}; it must name the input node")
    if len(outputs) != 1:
        problems.add(f"{where}.nodes", f"must have exactly one output node, has {len(outputs)}")
    else:
        graph.output = outputs[0]
    graph.in_edges = {name: [] for name in nodes}
    graph.out_edges = {name: [] for name in nodes}
    for edge in graph.edges:
        graph.in_edges[edge.target].append(edge)
        graph.out_edges[edge.source].append(edge)
        ew = f"{where}.edges[{edge.index}]"
        src = nodes[edge.source]
        if edge.weight is not None and src.kind != "split":
            problems.add(f"{ew}.weight", "is only allowed on edges out of a split node")
        if src.kind == "split":
            if edge.weight is None:
                problems.add(f"{ew}.weight", f"is required on edges out of split {src.name!r}")
            if edge.when is not None:
                problems.add(f"{ew}.when", "is not allowed on edges out of a split node")
        if edge.order and src.kind != "switch":
            problems.add(f"{ew}.order", "is only allowed on edges out of a switch node")
        if nodes[edge.target].kind == "input":
            problems.add(f"{ew}.target", "an edge cannot lead into the input node")
        if src.kind == "output":
            problems.add(f"{ew}.source", "an edge cannot leave the output node")
    for node in nodes.values():
        outs = graph.out_edges[node.name]
        if node.kind == "split" and outs and sum(e.weight or 0 for e in outs) <= 0:
            problems.add(f"{where}.nodes ({node.name})", "split weights add up to 0")
        if node.kind == "switch":
            defaults = [e for e in outs if e.when is None]
            if len(defaults) > 1:
                problems.add(f"{where}.nodes ({node.name})", "a switch has at most one default edge (without when)")
            if not defaults and node.on_no_match == "UNSPECIFIED":
                problems.add(
                    f"{where}.nodes ({node.name}).switch.on_no_match",
                    "must be ERROR or SKIP when the switch has no default edge",
                )
        data_in = [e for e in graph.in_edges[node.name] if e.mode == "DATA"]
        if node.join == "ALL" and any(e.into == "" and e.tensors is None for e in data_in) and len(data_in) > 1:
            problems.add(
                f"{where}.nodes ({node.name})", "an edge with an empty `into` must be the node's only data edge"
            )

    # Topological order (Kahn; ties by declaration order) and cycle detection.
    indegree = {name: len(graph.in_edges[name]) for name in nodes}
    position = {name: i for i, name in enumerate(nodes)}
    ready = sorted((n for n, d in indegree.items() if d == 0), key=position.__getitem__)
    order = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        newly = []
        for edge in graph.out_edges[name]:
            indegree[edge.target] -= 1
            if indegree[edge.target] == 0:
                newly.append(edge.target)
        ready = sorted(set(ready) | set(newly), key=position.__getitem__)
    if len(order) != len(nodes):
        stuck = [n for n in nodes if n not in order]
        problems.add(f"{where}.edges", f"form a cycle through {', '.join(stuck)}")
        return
    graph.order = order
    ancestors: dict[str, frozenset[str]] = {}
    for name in order:
        acc = set()
        for edge in graph.in_edges[name]:
            acc.add(edge.source)
            acc |= ancestors[edge.source]
        ancestors[name] = frozenset(acc)
    graph.ancestors = ancestors
    shadow = set()
    for name in order:
        node = nodes[name]
        ins = graph.in_edges[name]
        if node.shadow_percent is not None or (ins and all(e.source in shadow for e in ins)):
            shadow.add(name)
    graph.shadow = frozenset(shadow)
    for edge in graph.edges:
        if edge.source in shadow and edge.target not in shadow:
            problems.add(
                f"{where}.edges[{edge.index}]",
                f"leads from shadow node {edge.source!r} into {edge.target!r}, which is not shadow",
            )
    if problems.items:
        return  # reachability would only echo problems already listed (e.g. a dropped edge)
    for name in order:
        if name == graph.ingress or name in shadow:
            continue
        if graph.ingress not in ancestors[name]:
            problems.add(f"{where}.nodes ({name})", "is not reachable from the input node")
