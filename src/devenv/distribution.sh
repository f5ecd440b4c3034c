#!/usr/bin/env bash
# Builds the CNCF distribution registry (`registry`, from the Go module
# github.com/distribution/distribution/v3, cmd/registry) with the ordinary `go` client: the real
# OCI registry raypipe's tests push to and pull from. Idempotent: a binary whose version already
# matches is kept.
#
# Usage: distribution.sh [OUT_DIR]    (default: $RAYPIPE_CACHE_DIR/registry/v$DISTRIBUTION_VERSION)
# Prints "ready <dir>" as its last line on success.
set -euo pipefail

DISTRIBUTION_VERSION=${DISTRIBUTION_VERSION:-3.1.2}

CACHE=${RAYPIPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/raypipe}
OUT=${1:-$CACHE/registry/v$DISTRIBUTION_VERSION}
mkdir -p "$OUT" "$CACHE/registry"

export GOTOOLCHAIN=local CGO_ENABLED=0
command -v go >/dev/null || { echo "distribution: the Go toolchain (go >= 1.26) is required to build the registry" >&2; exit 2; }

log() { echo "distribution: $*" >&2; }

# One lock per cache, so parallel test binaries do not build the same thing twice.
exec 9>"$CACHE/registry/.lock"
flock 9

if [ -x "$OUT/registry" ] && "$OUT/registry" --version 2>/dev/null | grep -q -- "v$DISTRIBUTION_VERSION"; then
  echo "ready $OUT"
  exit 0
fi

start=$(date +%s)
log "building the distribution registry v$DISTRIBUTION_VERSION into $OUT; cold: ~2-4 min"
GOBIN="$OUT" go install -trimpath \
  -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=v$DISTRIBUTION_VERSION" \
  "github.com/distribution/distribution/v3/cmd/registry@v$DISTRIBUTION_VERSION"
log "done in $(( $(date +%s) - start ))s"
echo "ready $OUT"
