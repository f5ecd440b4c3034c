#!/usr/bin/env bash
# raypipe's release image, built without a container engine: the release binary (no `dev`
# feature) on a minimal Debian root filesystem (glibc, libgcc, CA certificates, time zones),
# written as a multi-architecture OCI image layout. Same commit, same toolchain and same Debian
# packages give the same digest: every timestamp is the commit's, files are sorted, owners are
# numeric, and the packages used are recorded in the image (dpkg status.d, a label).
#
#   deploy/image/build.sh [--platforms amd64,arm64] [--out DIR] [--tag TAG]
#       the whole image, from a clean copy of exactly what deploy/Containerfile copies
#   deploy/image/build.sh binary ARCH OUT_FILE
#       only the release binary, from the current directory (the Containerfile's build stage)
#   deploy/image/build.sh rootfs ARCH OUT_DIR
#       only the base root filesystem (the Containerfile's rootfs stage)
#
# Needs: cargo (rustup, with the aarch64-unknown-linux-gnu target and gcc-aarch64-linux-gnu for
# arm64), apt-get and dpkg-deb (Debian or Ubuntu; the archive keyring debian-archive-keyring),
# GNU tar, gzip, sha256sum. Caches under $RAYPIPE_CACHE_DIR/image (default
# ~/.cache/raypipe/image): the release target directory, the Debian package lists and .debs.
# Environment: SOURCE_DATE_EPOCH (default: the commit time of HEAD), DEBIAN_MIRROR (default
# http://deb.debian.org), RAYPIPE_IMAGE_DEBS (a directory of .debs to use instead of
# downloading: exact rebuilds of an older image).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${RAYPIPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/raypipe}/image
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org}
# What the base holds, and nothing else: the C library and its loader, the unwinder's libgcc,
# the Mozilla CA set (registries over HTTPS), the time zone database (RayCronJob time zones),
# and base-files for /etc/os-release (how image scanners tell the distribution).
# gcc-12-base carries libgcc-s1's copyright file.
packages=(base-files libc6 libgcc-s1 gcc-12-base ca-certificates tzdata)
uid=65532

# One scratch directory for the whole run, removed however it ends.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

log() { echo "image: $*" >&2; }
die() { echo "image: $*" >&2; exit 1; }

triple() {
  case $1 in
    amd64) echo x86_64-unknown-linux-gnu ;;
    arm64) echo aarch64-unknown-linux-gnu ;;
    *) die "unsupported architecture $1 (amd64 or arm64)" ;;
  esac
}

gnu_triple() {
  case $1 in
    amd64) echo x86_64-linux-gnu ;;
    arm64) echo aarch64-linux-gnu ;;
  esac
}

epoch() {
  if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
    echo "$SOURCE_DATE_EPOCH"
  elif git -C "$repo" rev-parse HEAD >/dev/null 2>&1; then
    git -C "$repo" log -1 --format=%ct
  else
    die "SOURCE_DATE_EPOCH is not set and $repo is not a git checkout"
  fi
}

# The release binary for ARCH, built in the current directory (a source tree). Paths of the
# build machine are mapped to fixed ones, so the binary does not depend on where it was built.
cmd_binary() {
  local arch=$1 out=$2 target
  target=$(triple "$arch")
  local cargo_home=${CARGO_HOME:-$HOME/.cargo}
  local target_dir=${CARGO_TARGET_DIR:-$PWD/target}
  # Generated code (prost's, under OUT_DIR) is named by its path in the target directory.
  local flags="--remap-path-prefix=$PWD=/raypipe --remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$target_dir=/target"
  local env=(CARGO_ENCODED_RUSTFLAGS="${flags// /$'\x1f'}")
  if [ "$arch" = arm64 ] && [ "$(uname -m)" != aarch64 ]; then
    command -v aarch64-linux-gnu-gcc >/dev/null \
      || die "arm64 needs the cross C toolchain (Debian: apt-get install gcc-aarch64-linux-gnu), or build with --platforms amd64"
    env+=(CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
          CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
          AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar)
  fi
  if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target" >&2
  fi
  log "cargo build --release --no-default-features --target $target"
  env "${env[@]}" cargo build --release --locked --no-default-features --bin raypipe \
    --target "$target" >&2
  cp "${CARGO_TARGET_DIR:-target}/$target/release/raypipe" "$out"
}

# apt-get with its own state under the cache, for Debian $suite and one architecture: the
# machine's own apt configuration, sources and architectures are neither read nor changed.
apt_private() {
  local arch=$1; shift
  local dir=$cache/apt/$suite-$arch
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [ -f "$keyring" ] || die "$keyring is missing (Debian/Ubuntu package debian-archive-keyring)"
  mkdir -p "$dir/lists/partial" "$dir/archives/partial" "$dir/etc"
  touch "$dir/status"
  cat > "$dir/etc/sources.list" <<EOF
deb [arch=$arch signed-by=$keyring] $mirror/debian $suite main
deb [arch=$arch signed-by=$keyring] $mirror/debian $suite-updates main
deb [arch=$arch signed-by=$keyring] $mirror/debian-security $suite-security main
EOF
  apt-get -q \
    -o APT::Architecture="$arch" -o APT::Architectures="$arch" \
    -o Dir::State="$dir" -o Dir::State::Lists="$dir/lists" -o Dir::State::status="$dir/status" \
    -o Dir::Cache="$dir" -o Dir::Cache::archives="$dir/archives" \
    -o Dir::Etc::SourceList="$dir/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null \
    -o APT::Sandbox::User=root -o Debug::NoLocking=1 "$@"
}

# The .deb files of $packages for ARCH: downloaded (apt checks them against the signed
# indexes) unless RAYPIPE_IMAGE_DEBS names a directory holding them.
fetch_debs() {
  local arch=$1 into=$2
  mkdir -p "$into"
  if [ -n "${RAYPIPE_IMAGE_DEBS:-}" ]; then
    local p
    for p in "${packages[@]}"; do
      compgen -G "$RAYPIPE_IMAGE_DEBS/${p}_*_$arch.deb" >/dev/null \
        || compgen -G "$RAYPIPE_IMAGE_DEBS/${p}_*_all.deb" >/dev/null \
        || die "no .deb of $p for $arch in $RAYPIPE_IMAGE_DEBS"
      cp "$RAYPIPE_IMAGE_DEBS/${p}"_*_{"$arch",all}.deb "$into"/ 2>/dev/null || true
    done
    return
  fi
  apt_private "$arch" update >&2
  (cd "$into" && apt_private "$arch" download "${packages[@]}" >&2)
}

# The base root filesystem for ARCH in OUT_DIR (which must not exist or be empty).
cmd_rootfs() {
  local arch=$1 out=$2 gnu
  triple "$arch" >/dev/null
  gnu=$(gnu_triple "$arch")
  local work=$scratch/rootfs-$arch
  rm -rf "$work" && mkdir -p "$work"
  fetch_debs "$arch" "$work/debs"
  mkdir -p "$out"
  local deb name
  for deb in "$work"/debs/*.deb; do
    name=$(dpkg-deb -f "$deb" Package)
    mkdir -p "$work/x/$name"
    dpkg-deb -x "$deb" "$work/x/$name"
    # What scanners (Trivy, Grype) read in distroless-style images: one control file each.
    mkdir -p "$out/var/lib/dpkg/status.d"
    { dpkg-deb -f "$deb" Package Version Architecture Source Maintainer Installed-Size
      echo "Status: install ok installed"; } > "$out/var/lib/dpkg/status.d/$name"
    if [ -f "$work/x/$name/usr/share/doc/$name/copyright" ]; then
      mkdir -p "$out/usr/share/doc/$name"
      cp "$work/x/$name/usr/share/doc/$name/copyright" "$out/usr/share/doc/$name/copyright"
    fi
    echo "$name $(dpkg-deb -f "$deb" Version) $(dpkg-deb -f "$deb" Architecture) $(sha256sum "$deb" | cut -d' ' -f1)"
  done | LC_ALL=C sort > "$work/packages.txt"
  mkdir -p "$out/usr/share/doc/raypipe"
  cp "$work/packages.txt" "$out/usr/share/doc/raypipe/debian-packages.txt"

  # glibc: the shared libraries and the loader (bookworm keeps them under /lib).
  mkdir -p "$out/lib/$gnu"
  cp -a "$work/x/libc6/lib/$gnu/." "$out/lib/$gnu/"
  case $arch in
    amd64) mkdir -p "$out/lib64" && cp -a "$work/x/libc6/lib64/." "$out/lib64/" ;;
    arm64) cp -a "$work/x/libc6/lib/ld-linux-aarch64.so.1" "$out/lib/" ;;
  esac
  cp -a "$work/x/libgcc-s1/lib/$gnu/." "$out/lib/$gnu/"
  # The CA bundle update-ca-certificates would write: every Mozilla certificate, in order.
  mkdir -p "$out/etc/ssl/certs"
  find "$work/x/ca-certificates/usr/share/ca-certificates/mozilla" -name '*.crt' -print0 \
    | LC_ALL=C sort -z | xargs -0 cat > "$out/etc/ssl/certs/ca-certificates.crt"
  # Time zones, without the leap-second variants ("right/") nothing here reads.
  mkdir -p "$out/usr/share/zoneinfo"
  cp -a "$work/x/tzdata/usr/share/zoneinfo/." "$out/usr/share/zoneinfo/"
  rm -rf "$out/usr/share/zoneinfo/right"
  mkdir -p "$out/etc" "$out/usr/lib"
  cp "$work/x/base-files/usr/lib/os-release" "$out/usr/lib/os-release"
  ln -sf ../usr/lib/os-release "$out/etc/os-release"
  cp "$work/x/base-files/etc/debian_version" "$out/etc/debian_version"
  # A numeric non-root user (the chart's runAsNonRoot checks the image's USER).
  printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnonroot:x:%s:%s:nonroot:/nonexistent:/usr/sbin/nologin\n' \
    "$uid" "$uid" > "$out/etc/passwd"
  printf 'root:x:0:\nnonroot:x:%s:\n' "$uid" > "$out/etc/group"
  mkdir -p "$out/tmp" "$out/usr/local/bin"
  chmod 1777 "$out/tmp"
  chmod 0644 "$out/etc/passwd" "$out/etc/group" "$out/etc/ssl/certs/ca-certificates.crt"
}

# A reproducible gzipped tar of DIR's contents: sorted, the commit's time on every entry, owned
# by root, no access or change times.
layer() {
  local dir=$1 out=$2
  tar --sort=name --mtime="@$(epoch)" --owner=0 --group=0 --numeric-owner \
    --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$dir" -cf "$out.tar" .
  gzip -n -9 -c "$out.tar" > "$out.tar.gz"
}

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

# Moves FILE into the layout's blobs and prints its digest.
blob() {
  local file=$1 layout=$2 digest
  digest=$(sha "$file")
  mkdir -p "$layout/blobs/sha256"
  mv "$file" "$layout/blobs/sha256/$digest"
  echo "$digest"
}

# The sources the Containerfile's build stage copies, one path per line. The Docker-free build
# uses exactly these, so a file the build reads but the Containerfile does not copy fails here
# as it would in `docker build`.
containerfile_sources() {
  awk '
    /^FROM / { stage = $NF }
    stage == "build" && /^COPY / && $0 !~ /--from=/ {
      for (i = 2; i < NF; i++) print $i
    }' "$repo/deploy/Containerfile"
}

# Makes DIR hold exactly the repository paths listed in FILE (files or directories): new or
# changed files are copied, unchanged ones are left alone, the rest is removed.
sync_sources() {
  local list=$1 dir=$2 path file
  ( cd "$repo" && while read -r path; do find "$path" -type f; done < "$list" ) | LC_ALL=C sort > "$scratch/wanted"
  while read -r file; do
    if ! cmp -s "$repo/$file" "$dir/$file"; then
      mkdir -p "$dir/$(dirname "$file")"
      cp "$repo/$file" "$dir/$file"
    fi
  done < "$scratch/wanted"
  ( cd "$dir" && find . -type f | sed 's|^\./||' | LC_ALL=C sort ) > "$scratch/present"
  LC_ALL=C comm -13 "$scratch/wanted" "$scratch/present" | while read -r file; do rm -f "$dir/$file"; done
}

cmd_image() {
  local platforms=amd64,arm64 out=$repo/target/image tag
  tag=$(sed -nE 's/^version = "(.*)"$/\1/p' "$repo/Cargo.toml" | head -1)
  while [ $# -gt 0 ]; do
    case $1 in
      --platforms) platforms=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --tag) tag=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  local created revision version
  created=$(date -u -d "@$(epoch)" +%Y-%m-%dT%H:%M:%SZ)
  version=$(sed -nE 's/^version = "(.*)"$/\1/p' "$repo/Cargo.toml" | head -1)
  revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
  if [ -n "$(git -C "$repo" status --porcelain 2>/dev/null)" ]; then
    revision=$revision-dirty
  fi

  # Exactly the Containerfile's inputs, at a fixed path. A file whose bytes did not change keeps
  # its old modification time, so a clone of a commit that was built before (CI's clean clone of
  # what a developer already built) rebuilds nothing.
  local src=$cache/src
  mkdir -p "$src"
  local path
  while read -r path; do
    [ -e "$repo/$path" ] || die "deploy/Containerfile copies $path, which does not exist"
    echo "$path"
  done < <(containerfile_sources) > "$scratch/sources"
  sync_sources "$scratch/sources" "$src"

  rm -rf "$out" && mkdir -p "$out"
  local work=$scratch/image
  mkdir -p "$work"
  local manifests=() arch
  IFS=, read -r -a arches <<< "$platforms"
  for arch in "${arches[@]}"; do
    log "$arch: release binary"
    mkdir -p "$work/$arch/app/usr/local/bin"
    (cd "$src" && CARGO_TARGET_DIR=$cache/target cmd_binary "$arch" "$work/$arch/app/usr/local/bin/raypipe")
    chmod 0755 "$work/$arch/app/usr/local/bin/raypipe"
    log "$arch: base root filesystem"
    cmd_rootfs "$arch" "$work/$arch/base" > /dev/null
    layer "$work/$arch/base" "$work/$arch/base"
    layer "$work/$arch/app" "$work/$arch/app"
    local base_diff app_diff base_size app_size base_digest app_digest debs
    base_diff=$(sha "$work/$arch/base.tar"); app_diff=$(sha "$work/$arch/app.tar")
    base_size=$(size "$work/$arch/base.tar.gz"); app_size=$(size "$work/$arch/app.tar.gz")
    base_digest=$(blob "$work/$arch/base.tar.gz" "$out")
    app_digest=$(blob "$work/$arch/app.tar.gz" "$out")
    debs=$(awk '{printf "%s%s=%s", (NR>1?",":""), $1, $2}' \
      "$work/$arch/base/usr/share/doc/raypipe/debian-packages.txt")
    cat > "$work/$arch/config.json" <<EOF
{"architecture":"$arch","os":"linux","created":"$created","config":{"User":"$uid:$uid","Entrypoint":["/usr/local/bin/raypipe"],"Env":["PATH=/usr/local/bin:/usr/bin:/bin","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],"ExposedPorts":{"8080/tcp":{},"9443/tcp":{}},"WorkingDir":"/","Labels":{"org.opencontainers.image.title":"raypipe","org.opencontainers.image.version":"$version","org.opencontainers.image.revision":"$revision","org.opencontainers.image.created":"$created","org.opencontainers.image.licenses":"Apache-2.0","dev.raypipe.image.debian-packages":"$debs"}},"rootfs":{"type":"layers","diff_ids":["sha256:$base_diff","sha256:$app_diff"]},"history":[{"created":"$created","created_by":"deploy/image/build.sh rootfs $arch ($suite: ${packages[*]})"},{"created":"$created","created_by":"deploy/image/build.sh binary $arch"}]}
EOF
    local config_size config_digest
    config_size=$(size "$work/$arch/config.json")
    config_digest=$(blob "$work/$arch/config.json" "$out")
    cat > "$work/$arch/manifest.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config_digest","size":$config_size},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:$base_digest","size":$base_size},{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:$app_digest","size":$app_size}],"annotations":{"org.opencontainers.image.created":"$created","org.opencontainers.image.revision":"$revision","org.opencontainers.image.version":"$version"}}
EOF
    local manifest_size manifest_digest
    manifest_size=$(size "$work/$arch/manifest.json")
    manifest_digest=$(blob "$work/$arch/manifest.json" "$out")
    manifests+=("{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$manifest_digest\",\"size\":$manifest_size,\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"}}")
    log "$arch: manifest sha256:$manifest_digest"
  done
  local joined
  joined=$(IFS=,; echo "${manifests[*]}")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s],"annotations":{"org.opencontainers.image.created":"%s","org.opencontainers.image.revision":"%s","org.opencontainers.image.version":"%s"}}\n' \
    "$joined" "$created" "$revision" "$version" > "$work/index-image.json"
  local index_size index_digest
  index_size=$(size "$work/index-image.json")
  index_digest=$(blob "$work/index-image.json" "$out")
  # The layout's entry point names the multi-architecture index under the tag.
  printf '{"imageLayoutVersion":"1.0.0"}\n' > "$out/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}\n' \
    "$index_digest" "$index_size" "$tag" > "$out/index.json"
  log "image index sha256:$index_digest ($platforms) in $out, tag $tag"
  echo "sha256:$index_digest"
}

case ${1:-} in
  binary) shift; [ $# -eq 2 ] || die "usage: build.sh binary ARCH OUT_FILE"; cmd_binary "$@" ;;
  rootfs) shift; [ $# -eq 2 ] || die "usage: build.sh rootfs ARCH OUT_DIR"; cmd_rootfs "$@" ;;
  -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) cmd_image "$@" ;;
esac
