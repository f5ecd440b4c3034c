"""The Ray Serve application builder raypipe renders as `import_path: raypipe_runtime.app:build`.

`build(args)` parses the graph from the application's args (spec.py), binds one deployment per
MODEL node (the user's class imported by path, named exactly after the node, with the node's
init arguments; its options come from the Serve config's `deployments`, which Serve applies by
that name) and returns the executor: the ingress deployment, named `args.executor_deployment`,
which runs the graph for every HTTP request (engine.py) by calling the nodes' handles.

Fused nodes (`args.fused_nodes`, chosen by raypipe's src/serve/fuse.rs: nodes with no
deployment options of their own) get no deployment: each executor replica constructs their
class itself and calls it in-process. The engine sees only another caller, so timeout, retries,
errors naming the node, fallback, shadow sampling and metrics are the same. As in a Serve
replica (RAY_SERVE_RUN_SYNC_IN_THREADPOOL, on by default in Ray 2.60), a synchronous method
runs in a worker thread, so it never blocks the executor's event loop and its timeout still
ends the wait (Python cannot stop the thread; its result is dropped). A class already decorated
with `@serve.deployment` carries options of its own in code, so it stays a deployment (logged).

HTTP: the request body is parsed as JSON (an empty body is null; a body that is not JSON is
handed on as text, and reading inside it is a 400). The response is the OUTPUT node's value as
JSON with status 200, or `{"error": {code, node, message, attempts}}` with the status of the
failure (400 INVALID_INPUT, 422 NO_ROUTE / OUTPUT_SKIPPED, a user exception's own 4xx
`status_code`, 502 NODE_FAILED / UNAVAILABLE / SELECT_MISSING, 503 BACKPRESSURE with
`Retry-After`, 504 TIMEOUT / DEADLINE). Headers: x-raypipe-graph, x-raypipe-route (switch/split
choices), x-raypipe-partial (skipped optional parts), x-raypipe-fallback, and x-raypipe-trace
when the request sends `x-raypipe-trace: 1` (then also a W3C `server-timing` header: each node's
call time and the graph's `_overhead`, in ms). Each executor replica records per-node and
per-graph metrics through Ray Serve's metrics API (metrics.py). The same answer is available by
handle as `handle_request(body, headers)` -> (status, bytes, media type, headers), which the
rollout router (router.py) calls on a version application that has no route of its own.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
from typing import TYPE_CHECKING, Any, cast

from . import engine, metrics
from . import spec as specs
from .pointer import RawBody
from .spec import ArgsError, GraphSpec, NodeSpec, parse_args

if TYPE_CHECKING:
    from ray.serve import Deployment

logger = logging.getLogger("raypipe_runtime")

EXECUTOR_MAX_ONGOING_REQUESTS = 100


def import_attr(import_path: str):
    """Imports "package.module:Attr" (or "package.module.Attr"); Attr may be dotted after ':'."""
    if ":" in import_path:
        module_name, attr_path = import_path.split(":", 1)
    else:
        module_name, _, attr_path = import_path.rpartition(".")
    module = importlib.import_module(module_name)
    target = module
    for part in attr_path.split("."):
        target = getattr(target, part)
    return target


def serve_deployment(target: Any, **options: Any) -> Deployment:
    """`serve.deployment(target, name=..., ...)`. Serve annotates the form with options only as
    a decorator factory, but called with the class as well it returns the Deployment."""
    from ray import serve

    return cast("Deployment", serve.deployment(target, **options))


def _node_field(graph: GraphSpec, node: NodeSpec, field: str) -> str:
    index = list(graph.nodes).index(node.name)
    return f'args.graph.nodes[{index}] ("{node.name}").model.{field}'


def _user_callable(target, method: str):
    """The user's function or method behind a class / function / serve.Deployment."""
    from ray import serve

    if isinstance(target, serve.Deployment):
        target = target.func_or_class
    if inspect.isclass(target):
        return getattr(target, method, None)
    return target if method == "__call__" else None


def _takes_headers(fn) -> bool:
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "headers" in params and params["headers"].kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def bind_models(spec):
    """One bound deployment per MODEL node that is not fused, named after the node; and the
    nodes whose method takes a `headers` keyword (they receive the graph's forward_headers).
    Fused nodes are checked the same way (import, method) but get no deployment."""
    from ray import serve
    from ray.serve.deployment import Application

    graph = spec.graph
    problems = []
    bound = {}
    header_nodes = []
    for node in graph.model_nodes():
        model = node.model
        where = _node_field(graph, node, "import_path")
        try:
            target = import_attr(model.import_path)
        except Exception as exc:  # ImportError, AttributeError, or an error inside the module
            problems.append((where, f"cannot import {model.import_path!r}: {engine.describe_exception(exc)}"))
            continue
        if isinstance(target, Application):
            problems.append(
                (
                    where,
                    f"{model.import_path!r} is an already bound application; "
                    "name the class (or @serve.deployment class) instead",
                )
            )
            continue
        if isinstance(target, serve.Deployment):
            deployment = target.options(name=node.name)
        elif inspect.isclass(target) or inspect.isfunction(target):
            deployment = serve_deployment(target, name=node.name)
        else:
            problems.append((where, f"{model.import_path!r} is a {type(target).__name__}, not a class or function"))
            continue
        fn = _user_callable(target, model.method)
        if fn is None:
            problems.append(
                (_node_field(graph, node, "method"), f"{model.import_path!r} has no method {model.method!r}")
            )
            continue
        if graph.forward_headers and _takes_headers(fn):
            header_nodes.append(node.name)
        if node.name in spec.fused_nodes:
            if not isinstance(target, serve.Deployment):
                continue  # constructed in each executor replica (GraphExecutor)
            logger.warning(
                "raypipe: node %r stays a deployment: %r is decorated with @serve.deployment, "
                "whose options are its own",
                node.name,
                model.import_path,
            )
        try:
            bound[node.name] = deployment.bind(*model.init_args, **model.init_kwargs)
        except Exception as exc:
            problems.append((_node_field(graph, node, "init_kwargs"), engine.describe_exception(exc)))
    if problems:
        raise ArgsError(problems)
    return bound, header_nodes


def build(args: dict):
    """Serve application builder: the graph in `args` -> the executor bound to every node.
    With shared node applications (`args.wiring: user_config`) the executor is bound alone:
    its graph and its nodes' applications arrive in `reconfigure`."""
    if specs.is_shared(args):
        shared = specs.parse_shared_args(args)
        executor = serve_deployment(
            GraphExecutor, name=shared.executor_deployment, max_ongoing_requests=EXECUTOR_MAX_ONGOING_REQUESTS
        )
        logger.info("raypipe: built an executor with %d fused nodes; its graph comes in user_config", len(shared.fused))
        return executor.bind(args, {}, [])
    spec = parse_args(args)
    bound, header_nodes = bind_models(spec)
    # The executor mostly waits on its nodes, so it takes many requests at once (Ray's default
    # of 5 would cap the whole graph); the config's `deployments` entry overrides this.
    executor = serve_deployment(
        GraphExecutor, name=spec.executor_deployment, max_ongoing_requests=EXECUTOR_MAX_ONGOING_REQUESTS
    )
    logger.info(
        "raypipe: built graph %r (%d nodes, %d model deployments, %d fused into %s)",
        spec.graph.name,
        len(spec.graph.nodes),
        len(bound),
        len(spec.graph.model_nodes()) - len(bound),
        spec.executor_deployment,
    )
    return executor.bind(args, bound, header_nodes)


def _ray_caller(handle, method: str):
    """An engine caller over a DeploymentHandle: Ray's failures mapped to the engine's classes."""
    import ray.exceptions as rex
    from ray.serve import exceptions as sex

    target = handle.options(method_name=method) if method != "__call__" else handle
    unavailable: tuple[type[BaseException], ...] = (
        rex.ActorDiedError,
        rex.ActorUnavailableError,
        rex.RayActorError,
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.ActorUnschedulableError,
        sex.DeploymentUnavailableError,
    )
    # Serve 2.52 has no ReplicaUnavailableError (a replica lost mid-call surfaces there as one
    # of Ray's actor errors above); newer Serve raises it, so it is added where it exists.
    if hasattr(sex, "ReplicaUnavailableError"):
        unavailable += (sex.ReplicaUnavailableError,)

    async def call(*args, **kwargs):
        response = target.remote(*args, **kwargs)
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()
            raise
        except sex.BackPressureError as exc:
            raise engine.Backpressure(str(exc), retry_after_s=getattr(exc, "retry_after_s", None)) from None
        except unavailable as exc:
            raise engine.Unavailable(type(exc).__name__) from None
        except rex.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise

    return call


def construct_fused(node: NodeSpec):
    """A fused node's model object in this process: the class constructed with the node's init
    arguments (a function is its own callable)."""
    model = node.model
    assert model is not None  # only model nodes are fused
    target = import_attr(model.import_path)
    if inspect.isclass(target):
        return target(*model.init_args, **model.init_kwargs)
    return target


def _local_caller(obj, method: str):
    """An engine caller over a model object in this process: a coroutine method is awaited
    right here; a plain one runs in a worker thread (as Serve runs it in a replica)."""
    fn = obj if inspect.isfunction(obj) else getattr(obj, method)
    if inspect.iscoroutinefunction(fn):
        return fn

    async def call(*args, **kwargs):
        return await asyncio.to_thread(fn, *args, **kwargs)

    return call


def parse_body(body: bytes) -> Any:
    if not body or not body.strip():
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return RawBody(body.decode("utf-8", errors="replace"))


def encode_result(result: engine.Result):
    """(status, bytes, media type, headers) of an engine result."""
    body = result.body
    if isinstance(body, (bytes, bytearray)):
        return result.status, bytes(body), "application/octet-stream", result.headers
    try:
        content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        error = engine.GraphError(
            "NODE_FAILED", None, f"the response is not JSON-serialisable: {engine.describe_exception(exc)}", status=500
        )
        content = json.dumps(error.body()).encode("utf-8")
        return 500, content, "application/json", result.headers
    return result.status, content, "application/json", result.headers


def _construct_all_fused(fused: dict) -> dict:
    objects = {}
    for name, node in fused.items():
        try:
            objects[name] = construct_fused(node)
        except Exception as exc:
            # The replica does not start; Serve shows this message in the status.
            raise RuntimeError(
                f"raypipe: fused node {name!r} ({node.model.import_path}) "
                f"failed to construct: {engine.describe_exception(exc)}"
            ) from exc
    return objects


def _header_nodes(graph: GraphSpec, names) -> list:
    """The nodes among `names` whose method takes the graph's forwarded headers (their classes
    imported here, in the version application's environment, as `bind_models` does)."""
    if not graph.forward_headers:
        return []
    found, problems = [], []
    for name in names:
        model = graph.nodes[name].model
        try:
            fn = _user_callable(import_attr(model.import_path), model.method)
        except Exception as exc:
            problems.append((_node_field(graph, graph.nodes[name], "import_path"), engine.describe_exception(exc)))
            continue
        if _takes_headers(fn):
            found.append(name)
    if problems:
        raise ArgsError(problems)
    return found


class GraphExecutor:
    """The ingress deployment: runs the graph for every HTTP request."""

    def __init__(self, args: dict, handles: dict, header_nodes: list):
        self.shared = specs.parse_shared_args(args) if specs.is_shared(args) else None
        if self.shared is not None:
            # The graph comes in `reconfigure`, which Serve calls before the first request.
            self.fused_objects = _construct_all_fused(self.shared.fused)
            self.node_applications: dict[str, str] = {}
            return
        self.spec = parse_args(args)
        callers = {}
        for node in self.spec.graph.model_nodes():
            if node.name in handles:
                callers[node.name] = _ray_caller(handles[node.name], node.model.method)
                continue
            try:
                obj = construct_fused(node)
            except Exception as exc:
                # The replica does not start; Serve shows this message in the status.
                raise RuntimeError(
                    f"raypipe: fused node {node.name!r} ({node.model.import_path}) "
                    f"failed to construct: {engine.describe_exception(exc)}"
                ) from exc
            callers[node.name] = _local_caller(obj, node.model.method)
        self.executor = engine.Executor(
            self.spec.graph, callers, header_nodes=header_nodes, observer=metrics.ray_observer(self.spec.graph)
        )

    async def reconfigure(self, user_config: dict):
        """A new wiring (shared node applications): the graph, its fused nodes' names and the
        application of each deployed node. The new engine replaces the old one in one
        assignment, so a request in flight finishes on the graph that took it; nothing
        restarts. A wiring this executor cannot run raises with every problem named, which
        Serve reports as the deployment's failure."""
        if self.shared is None:
            raise ArgsError([("user_config", "this executor's graph is in its args; it takes no user_config")])
        runtime, applications = specs.parse_wiring(user_config, self.shared)
        from ray import serve

        graph = runtime.graph
        header_nodes = _header_nodes(graph, [n.name for n in graph.model_nodes()])
        callers = {}
        for node in graph.model_nodes():
            if node.name in runtime.fused_nodes:
                callers[node.name] = _local_caller(self.fused_objects[node.name], node.model.method)
            else:
                handle = serve.get_deployment_handle(node.name, app_name=applications[node.name])
                callers[node.name] = _ray_caller(handle, node.model.method)
        executor = engine.Executor(graph, callers, header_nodes=header_nodes, observer=metrics.ray_observer(graph))
        self.spec, self.node_applications, self.executor = runtime, applications, executor
        logger.info(
            "raypipe: executor now runs graph %r (version %r) over %d node applications",
            graph.name,
            graph.version,
            len(set(applications.values())),
        )

    async def handle_request(self, body: bytes, headers: dict):
        """One request as (status, content bytes, media type, response headers): what the HTTP
        path answers, and what the rollout router (router.py) calls by handle."""
        result = await self.executor.run(parse_body(body), headers)
        return encode_result(result)

    async def __call__(self, request):
        from starlette.responses import Response

        status, content, media_type, headers = await self.handle_request(await request.body(), dict(request.headers))
        return Response(content=content, status_code=status, media_type=media_type, headers=headers)
