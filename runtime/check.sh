#!/usr/bin/env bash
# The graph runtime's lints (settings in runtime/pyproject.toml): ruff's linter and its format
# check on the package and its tests, then mypy on the package. ruff and mypy are the pinned
# ones of the cached Ray test venv (src/devenv/ray/mod.rs pins them, provision-ray.sh installs
# them); mypy runs beside Ray so it checks the runtime against Ray's own annotations.
#
# Usage: runtime/check.sh          (.ci/run runs it before cargo test; warm, a few seconds)
set -euo pipefail
cd "$(dirname "$0")"

cache=${RAYPIPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/raypipe}
# Provisions the venv on first use (about a minute cold) and prints "ready <venv>" last.
ready=$(RAYPIPE_CACHE_DIR=$cache bash ../src/devenv/ray/provision-ray.sh | tail -n 1)
venv=${ready#ready }
[ -x "$venv/bin/ruff" ] && [ -x "$venv/bin/mypy" ] || { echo "check.sh: no ruff or mypy in $venv" >&2; exit 1; }

# Their caches live with raypipe's other caches, never in the work tree.
export RUFF_CACHE_DIR=$cache/lint/ruff
"$venv/bin/ruff" --version
"$venv/bin/ruff" check raypipe_runtime tests
"$venv/bin/ruff" format --check raypipe_runtime tests
"$venv/bin/mypy" --version
"$venv/bin/mypy" --cache-dir "$cache/lint/mypy"
