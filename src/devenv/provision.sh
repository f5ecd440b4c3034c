#!/usr/bin/env bash
# Builds the control-plane binaries that raypipe's tests and `raypipe dev` run:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (from k8s.io/kubernetes),
# etcd (from go.etcd.io/etcd/server/v3) and kwok (sigs.k8s.io/kwok), each from its Go module
# with the ordinary `go` client. Idempotent: a binary whose version already matches is kept.
#
# Usage: provision.sh [OUT_DIR]    (default: $RAYPIPE_CACHE_DIR/k8s/v$KUBE_VERSION)
# Prints "ready <dir>" as its last line on success.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-1.36.3}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}

CACHE=${RAYPIPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/raypipe}
OUT=${1:-$CACHE/k8s/v$KUBE_VERSION-etcd$ETCD_VERSION-kwok$KWOK_VERSION}
SRC=$CACHE/k8s/src
mkdir -p "$OUT" "$SRC"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
command -v go >/dev/null || { echo "provision: the Go toolchain (go >= 1.26) is required to build the control plane" >&2; exit 2; }

log() { echo "provision: $*" >&2; }

# One lock per cache, so parallel test binaries do not build the same thing twice.
exec 9>"$CACHE/k8s/.lock"
flock 9

has_version() { [ -x "$1" ] && "$1" --version 2>/dev/null | grep -q -- "$2"; }

build_kube() {
  local want=v$KUBE_VERSION
  if has_version "$OUT/kube-apiserver" "$want" && has_version "$OUT/kube-controller-manager" "$want" \
     && has_version "$OUT/kube-scheduler" "$want" && [ -x "$OUT/kubectl" ]; then
    return
  fi
  local w=$SRC/kube-$KUBE_VERSION minor=${KUBE_VERSION#1.}
  minor=${minor%%.*}
  mkdir -p "$w"
  log "building Kubernetes $want (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl); cold: ~20-30 min on 2 cores"
  (
    cd "$w"
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$want" | sed -nE 's/^[[:space:]]*"GoMod": "(.*)",?$/\1/p')
    [ -f "$gomod" ] || { log "cannot download k8s.io/kubernetes@$want from the Go module proxy"; exit 1; }
    local godebug
    godebug=$(sed -nE 's/^godebug (.*)$/\1/p' "$gomod" | head -1)
    cat > go.mod <<GOMOD
module local.test/raypipe-k8sbins

go 1.26.0

godebug ${godebug:-default=go1.26}

require k8s.io/kubernetes $want
GOMOD
    local m
    for m in $(sed -nE 's#^[[:space:]]*(k8s\.io/[A-Za-z0-9._-]+)[[:space:]]+=>[[:space:]]+\./staging/.*#\1#p' "$gomod"); do
      go mod edit -replace="$m=$m@v0.${KUBE_VERSION#1.}"
    done
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    go mod tidy >&2
    local ldf="-s -w" p
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldf="$ldf -X $p.gitVersion=$want -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    go build -trimpath -ldflags "$ldf" -o "$OUT/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  )
}

build_etcd() {
  has_version "$OUT/etcd" "$ETCD_VERSION" && return
  local w=$SRC/etcd-$ETCD_VERSION
  mkdir -p "$w"
  log "building etcd v$ETCD_VERSION; cold: ~2 min"
  (
    cd "$w"
    [ -f go.mod ] || go mod init local.test/raypipe-etcdbin >&2
    printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
    go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2
    go mod tidy >&2
    go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$ETCD_VERSION" -o "$OUT/etcd" go.etcd.io/etcd/server/v3
  )
}

build_kwok() {
  has_version "$OUT/kwok" "$KWOK_VERSION" && [ -d "$OUT/kwok-stages" ] && return
  log "building kwok v$KWOK_VERSION; cold: ~5 min"
  GOBIN="$OUT" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" \
    "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
  # kwok needs Stage configs; take the ones its own module ships.
  local stages
  stages=$(go env GOMODCACHE)/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize/stage
  rm -rf "$OUT/kwok-stages"
  mkdir -p "$OUT/kwok-stages"
  cp "$stages/node/fast/node-initialize.yaml" "$stages/node/heartbeat/node-heartbeat.yaml" \
     "$stages/pod/fast/pod-ready.yaml" "$stages/pod/fast/pod-complete.yaml" "$stages/pod/fast/pod-delete.yaml" \
     "$OUT/kwok-stages/"
  chmod -R u+w "$OUT/kwok-stages"
}

start=$(date +%s)
build_etcd
build_kube
build_kwok
log "done in $(( $(date +%s) - start ))s"
echo "ready $OUT"
