#!/usr/bin/env bash
# Build the test-runner image(s) without a registry: a Debian base from debootstrap, Python
# packages from a local wheelhouse. Reuses what exists. Usage: build_images.sh REPO_ROOT [backend...]
set -euo pipefail
root=$1; shift
backends=("${@:-cpu}")
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/docker/containers.conf}
base=localhost/ci-relay-base:bookworm
work=${CI_RELAY_IMAGE_WORK:-/var/tmp/ci-relay-images}
mkdir -p "$work"

if ! podman image exists "$base"; then
  echo "images: building $base with debootstrap (a few minutes)" >&2
  rootfs=$(mktemp -d "$work/rootfs.XXXX")
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    bookworm "$rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { echo "images: debootstrap failed, see $work/debootstrap.log" >&2; exit 1; }
  tar -C "$rootfs" -c . | podman import -q - "$base" >/dev/null
  rm -rf "$rootfs"
fi

wheels="$work/context/wheels"
mkdir -p "$wheels"
rm -f "$wheels"/ci_relay-*.whl
python3 -m pip wheel -q --no-deps -w "$wheels" "$root" >/dev/null
python3 -m pip download -q -d "$wheels" torch==2.13.0 expecttest numpy \
  "pytest>=8,<10" "pydantic>=2.7,<3" "PyYAML>=6,<7" "typer>=0.12,<1" "rich>=13.7,<16"
for backend in "${backends[@]}"; do
  file="$root/docker/runner-$backend.Containerfile"
  [ -f "$file" ] || { echo "images: no $file" >&2; exit 1; }
  digest=$( (sha256sum "$file"; ls -l "$wheels" | sha256sum; sha256sum "$wheels"/ci_relay-*.whl) | sha256sum | cut -c1-16)
  image=localhost/ci-relay-runner-$backend
  if podman image exists "$image:$digest"; then
    echo "images: $image:$digest is up to date" >&2
  else
    echo "images: building $image:$digest" >&2
    cp "$file" "$work/context/Containerfile"
    podman build -q --build-arg BASE="$base" -t "$image:$digest" "$work/context" >/dev/null
  fi
  podman tag "$image:$digest" "$image:latest"
done
