"""Keeps the gRPC servers of a raypipe test Ray head on loopback.

raypipe writes this file into each test head's directory and puts that directory first on
the PYTHONPATH of every Ray process, where Python imports it at start-up. Ray Serve 2.60
replicas start their inter-deployment gRPC server on "[::]:0" (every interface) and the Serve
gRPC proxy on "[::]:<port>", with no setting to change either; test heads must listen on
127.0.0.1 only. So, as Ray loads the two helpers that open those ports, they are wrapped to
turn a wildcard host into 127.0.0.1. Nothing else changes, and any failure here leaves Ray
as it is rather than breaking it.
"""

import importlib.abc
import sys

_WRAPPED = {
    "ray._common.tls_utils": "add_port_to_grpc_server",
    "ray.serve._private.default_impl": "add_grpc_address",
}
_WILDCARD_HOSTS = ("[::]:", "0.0.0.0:", "[::0]:")


def _loopback(address):
    if isinstance(address, str):
        for wildcard in _WILDCARD_HOSTS:
            if address.startswith(wildcard):
                return "127.0.0.1:" + address[len(wildcard):]
    return address


def _wrap(module):
    name = _WRAPPED[module.__name__]
    original = getattr(module, name, None)
    if original is None or getattr(original, "_raypipe_loopback", False):
        return

    def on_loopback(server, address, *args, **kwargs):
        return original(server, _loopback(address), *args, **kwargs)

    on_loopback._raypipe_loopback = True
    on_loopback.__doc__ = original.__doc__
    setattr(module, name, on_loopback)


class _WrappingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            _wrap(module)
        except Exception:
            pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _WRAPPED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _WrappingLoader(spec.loader)
                return spec
        return None


sys.meta_path.insert(0, _Finder())
