"""raypipe's graph runtime: the Ray Serve application builder that runs a raypipe model graph.

`raypipe_runtime.app:build` is the import path raypipe renders; `args` carries the graph (see
spec.py). The engine (engine.py) does not depend on Ray. Pure standard library plus what
`ray[serve]` ships (starlette), so a zip of this directory is all a cluster needs.
"""

__version__ = "0.1.0"

from .spec import ArgsError, parse_args  # noqa: F401
