"""The builder of a shared node application (`import_path: raypipe_runtime.node_app:build`).

With shared node applications (src/serve/shared.rs) each deployed model node of a graph is a
Serve application of its own, named by a hash of what its replicas are built from, so every
graph version that uses the same node calls the same replicas. Its args hold exactly that
definition (spec.parse_node_args); its deployment is named after the node, and its options come
from the config's `deployments` entry, as in a one-application graph. Version applications'
executors call it by handle (`serve.get_deployment_handle(node, app_name=...)`).
"""

from __future__ import annotations

import inspect
import logging

from . import engine
from .app import import_attr, serve_deployment
from .spec import ArgsError, parse_node_args

logger = logging.getLogger("raypipe_runtime")


def build(args: dict):
    """Serve application builder: the node's class (or function) bound to its init arguments."""
    from ray import serve
    from ray.serve.deployment import Application

    name, model = parse_node_args(args)
    try:
        target = import_attr(model.import_path)
    except Exception as exc:  # ImportError, AttributeError, or an error inside the module
        raise ArgsError(
            [("args.model.import_path", f"cannot import {model.import_path!r}: {engine.describe_exception(exc)}")]
        ) from None
    if isinstance(target, Application):
        raise ArgsError(
            [("args.model.import_path", f"{model.import_path!r} is an already bound application; name the class")]
        )
    if isinstance(target, serve.Deployment):
        deployment = target.options(name=name)
    elif inspect.isclass(target) or inspect.isfunction(target):
        deployment = serve_deployment(target, name=name)
    else:
        raise ArgsError(
            [("args.model.import_path", f"{model.import_path!r} is a {type(target).__name__}, not a class or function")]
        )
    logger.info("raypipe: built node %r (%s)", name, model.import_path)
    try:
        return deployment.bind(*model.init_args, **model.init_kwargs)
    except Exception as exc:
        raise ArgsError([("args.model.init_kwargs", engine.describe_exception(exc))]) from None
