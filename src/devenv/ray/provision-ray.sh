#!/usr/bin/env bash
# Creates the Python virtualenv that raypipe's tests (and `raypipe dev`) start Ray heads from:
# a pinned `ray[serve]` from PyPI, plus the graph runtime's pinned test tools: `pytest` for its
# tests (runtime/tests), `ruff` and `mypy` for its lints (runtime/pyproject.toml; mypy lives
# beside Ray so it reads Ray's own annotations), installed with the ordinary pip client.
# Idempotent: a venv whose marker names the same versions and Python interpreter is kept as it
# is; one with the same Ray and Python but other test tools only gets the test tools installed.
#
# Usage: provision-ray.sh [VENV_DIR]    (default: $RAYPIPE_CACHE_DIR/ray/venv-$RAY_VERSION)
# Env:   RAY_VERSION (default 2.60.0), PYTEST_VERSION (default 9.2.0), RUFF_VERSION (default
#        0.17.5), MYPY_VERSION (default 2.4.1), PYTHON (default python3; Ray 2.52-2.60 wheels: CPython 3.10-3.13),
#        RAY_CONSTRAINTS (pip constraints, space-separated, e.g. "protobuf<7": what a later release of a
#        dependency broke for an older Ray; part of the marker, so changing them rebuilds the venv)
# Each Ray version gets its own venv (the directory name carries the version), so several can be
# cached side by side. Prints "ready <dir>" as its last line on success.
set -euo pipefail

RAY_VERSION=${RAY_VERSION:-2.60.0}
PYTEST_VERSION=${PYTEST_VERSION:-9.2.0}
RUFF_VERSION=${RUFF_VERSION:-0.17.5}
MYPY_VERSION=${MYPY_VERSION:-2.4.1}
PYTHON=${PYTHON:-python3}
RAY_CONSTRAINTS=${RAY_CONSTRAINTS:-}

CACHE=${RAYPIPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/raypipe}
VENV=${1:-$CACHE/ray/venv-$RAY_VERSION}
mkdir -p "$CACHE/ray" "$(dirname "$VENV")"

log() { echo "provision-ray: $*" >&2; }

command -v "$PYTHON" >/dev/null || { log "$PYTHON is required (CPython 3.10-3.13)"; exit 2; }
PY_VERSION=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
TEST_TOOLS=("pytest==$PYTEST_VERSION" "ruff==$RUFF_VERSION" "mypy==$MYPY_VERSION")
WANT="ray[serve]==$RAY_VERSION ${TEST_TOOLS[*]} python=$PY_VERSION"
# Constraints are named only when there are any, so a venv built without them keeps its marker.
CONSTRAINTS_WORD=$(printf '%s' "$RAY_CONSTRAINTS" | tr -s ' ' ',')
[ -z "$CONSTRAINTS_WORD" ] || WANT="$WANT constraints=$CONSTRAINTS_WORD"
MARKER=$VENV/.raypipe-provisioned

# One lock per cache, so parallel test binaries do not install into the same venv at once.
exec 9>"$CACHE/ray/.lock"
flock 9

if [ -x "$VENV/bin/ray" ] && [ "$(cat "$MARKER" 2>/dev/null)" = "$WANT" ]; then
  echo "ready $VENV"
  exit 0
fi

CONSTRAINTS_FILE=$VENV/raypipe-constraints.txt
pip_install() {
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --quiet \
    -c "$CONSTRAINTS_FILE" "$@" >&2
}

# Same Ray, Python and constraints, other (or no) test tools: install just those, in place.
HAVE=$(cat "$MARKER" 2>/dev/null || true)
without_test_tools() { echo "$1" | sed -E 's/ (pytest|ruff|mypy)==[^ ]*//g'; }
write_constraints() { tr ' ' '\n' <<< "$RAY_CONSTRAINTS" > "$CONSTRAINTS_FILE"; }
if [ -x "$VENV/bin/ray" ] && [ -x "$VENV/bin/python" ] \
  && [ "$(without_test_tools "$HAVE")" = "$(without_test_tools "$WANT")" ]; then
  log "adding ${TEST_TOOLS[*]} to $VENV"
  write_constraints
  pip_install "${TEST_TOOLS[@]}"
  echo "$WANT" > "$MARKER"
  echo "ready $VENV"
  exit 0
fi

start=$(date +%s)
log "installing $WANT into $VENV; cold: about a minute (downloads ~100 MB of wheels)"
# A venv is not relocatable (its scripts name their interpreter by absolute path), so it is
# built in place; the marker is written last, so an interrupted install is redone next time.
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
write_constraints
pip_install "ray[serve]==$RAY_VERSION" "${TEST_TOOLS[@]}"
got=$("$VENV/bin/python" -c 'import ray, ray.serve; print(ray.__version__)')
[ "$got" = "$RAY_VERSION" ] || { log "installed ray $got, wanted $RAY_VERSION"; exit 1; }
echo "$WANT" > "$MARKER"
log "done in $(( $(date +%s) - start ))s"
echo "ready $VENV"
