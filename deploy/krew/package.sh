#!/usr/bin/env bash
# The `kubectl raypipe` plugin as krew installs it: per platform an archive holding the raypipe
# binary under the plugin's name, and one krew manifest naming them with their sha256.
#
#   deploy/krew/package.sh OUT_DIR URL_BASE BINARY:ARCH [BINARY:ARCH ...]
#
# BINARY is a release build of raypipe (deploy/image/build.sh binary ARCH FILE makes one),
# ARCH amd64 or arm64; URL_BASE is where the archives will be downloaded from (the release's
# page). Writes OUT_DIR/kubectl-raypipe_<version>_linux_<arch>.tar.gz and OUT_DIR/raypipe.yaml
# (install it with `kubectl krew install --manifest=raypipe.yaml --archive=<archive>`).
# Same binaries give the same archives: the file's time is SOURCE_DATE_EPOCH (default: the
# commit time of HEAD), owners are numeric, gzip stores no name or time.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ $# -lt 3 ]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
out=$1 url_base=${2%/}
shift 2
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n1)
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

platforms=""
for spec in "$@"; do
  binary=${spec%:*} arch=${spec##*:}
  case $arch in amd64|arm64) ;; *) echo "package: unknown arch $arch (amd64 or arm64)" >&2; exit 2 ;; esac
  [ -x "$binary" ] || { echo "package: $binary is not an executable" >&2; exit 2; }
  name="kubectl-raypipe_${version}_linux_${arch}.tar.gz"
  rm -rf "$scratch/$arch" && mkdir -p "$scratch/$arch"
  cp "$binary" "$scratch/$arch/kubectl-raypipe"
  chmod 0755 "$scratch/$arch/kubectl-raypipe"
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
      -C "$scratch/$arch" -cf - kubectl-raypipe | gzip -n -9 > "$out/$name"
  sum=$(sha256sum "$out/$name" | cut -d' ' -f1)
  platforms+="  - selector:
      matchLabels:
        os: linux
        arch: $arch
    uri: $url_base/$name
    sha256: $sum
    bin: kubectl-raypipe
"
done

cat > "$out/raypipe.yaml" <<MANIFEST
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: raypipe
spec:
  version: v$version
  shortDescription: See and steer raypipe ServePipelines and their rollouts
  description: |
    Lists ServePipelines with the version serving and the canary, draws a
    pipeline's graph as it runs (terminal, SVG, DOT), and follows and steers
    canary rollouts: status, pause, resume, promote, abort, retry. Reads the
    replicas' logs from Ray and forwards the Ray dashboard and Serve to
    loopback (session), through the API server's port-forward.
    Every verb prints JSON or YAML with --output.
  caveats: |
    The plugin acts with your own Kubernetes permissions: get on
    servepipelines and rayservices to read, patch on servepipelines to steer
    a rollout, create on events to record who asked, and get on pods with
    create on pods/portforward for logs and session.
  platforms:
$platforms
MANIFEST
echo "$out/raypipe.yaml"
