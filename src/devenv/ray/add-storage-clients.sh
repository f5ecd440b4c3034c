#!/usr/bin/env bash
# Adds to a Ray venv made by provision-ray.sh the pinned client Ray's own downloader imports for
# `s3://` URIs in a runtime_env (`working_dir`, `py_modules`): boto3 (smart_open, its other
# import, already comes with ray[serve]). Installed in place with the ordinary pip client, under
# provision-ray.sh's lock, with a marker of its own (`.raypipe-storage-clients`), so the venv's
# own marker (Ray and the test tools) is left as it is.
#
# Usage: add-storage-clients.sh VENV_DIR    Env: BOTO3_VERSION (required)
# Prints "ready <dir>" as its last line on success.
set -euo pipefail

VENV=$1
BOTO3_VERSION=${BOTO3_VERSION:?BOTO3_VERSION is required}
CACHE=${RAYPIPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/raypipe}
WANT="boto3==$BOTO3_VERSION"
MARKER=$VENV/.raypipe-storage-clients

log() { echo "add-storage-clients: $*" >&2; }

[ -x "$VENV/bin/python" ] || { log "$VENV is not a provisioned Ray venv"; exit 2; }
mkdir -p "$CACHE/ray"
exec 9>"$CACHE/ray/.lock"
flock 9

if [ "$(cat "$MARKER" 2>/dev/null)" = "$WANT" ]; then
  echo "ready $VENV"
  exit 0
fi

start=$(date +%s)
log "adding $WANT to $VENV"
constraints=()
[ -f "$VENV/raypipe-constraints.txt" ] && constraints=(-c "$VENV/raypipe-constraints.txt")
"$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --quiet \
  "${constraints[@]}" "$WANT" >&2
# What Ray's s3 protocol handler imports (ray/_private/runtime_env/protocol.py).
"$VENV/bin/python" -c 'import boto3, smart_open' >&2
echo "$WANT" > "$MARKER"
log "done in $(( $(date +%s) - start ))s"
echo "ready $VENV"
