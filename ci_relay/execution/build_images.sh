#!/usr/bin/env bash
# Build ci-relay's images without a registry: a Debian base from debootstrap, Python packages
# from a local wheelhouse. Reuses an image whose inputs did not change (tagged by digest).
# Usage: build_images.sh REPO_ROOT TARGET...   TARGET: runner-cpu | runner-spyre-emu |
# runner-spyre | relay. runner-spyre needs CI_RELAY_SPYRE_BASE_IMAGE and CI_RELAY_SPYRE_WHEELHOUSE.
set -euo pipefail
root=$1; shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(runner-cpu)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/docker/containers.conf}
work=${CI_RELAY_IMAGE_WORK:-/var/tmp/ci-relay-images}
mkdir -p "$work"
say() { echo "images: $*" >&2; }
# the tag a worker asks for: the digest of the ci-relay sources the image runs
src=$(PYTHONPATH="$root" python3 -m ci_relay.source_digest "$root")

for target in "${targets[@]}"; do  # refuse before any slow step
  case $target in
    runner-cpu|runner-spyre-emu|relay) ;;
    runner-spyre)
      if [ -z "${CI_RELAY_SPYRE_BASE_IMAGE:-}" ] || [ -z "${CI_RELAY_SPYRE_WHEELHOUSE:-}" ]; then
        say "runner-spyre needs the Spyre software stack, which is not public:"
        say "  CI_RELAY_SPYRE_BASE_IMAGE = an image with the Spyre runtime and driver libraries"
        say "  CI_RELAY_SPYRE_WHEELHOUSE = a folder with the torch_spyre wheel (and its deps)"
        exit 2
      fi ;;
    *)
      say "unknown image $target (known: runner-cpu runner-spyre-emu runner-spyre relay)"
      exit 2 ;;
  esac
done

# Runner images need only Python; the relay also needs git (its upstream mirrors).
packages=python3,python3-venv,ca-certificates,passwd,git
base=localhost/ci-relay-base:bookworm-$(echo "$packages" | sha256sum | cut -c1-8)
if ! podman image exists "$base"; then
  say "building $base with debootstrap (a few minutes)"
  rootfs=$(mktemp -d "$work/rootfs.XXXX")
  debootstrap --variant=minbase --include="$packages" \
    bookworm "$rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { say "debootstrap failed, see $work/debootstrap.log"; exit 1; }
  tar -C "$rootfs" -c . | podman import -q - "$base" >/dev/null
  rm -rf "$rootfs"
fi

runner_wheels() {  # torch and the runner side of ci-relay (its own wheel without dependencies)
  local wheels="$work/runner/wheels"
  mkdir -p "$wheels"
  rm -f "$wheels"/ci_relay-*.whl
  rm -rf "$root/build"  # setuptools never prunes build/lib: a deleted module would ship
  SOURCE_DATE_EPOCH=315532800 python3 -m pip wheel -q --no-deps -w "$wheels" "$root" >/dev/null
  python3 -m pip download -q -d "$wheels" torch==2.13.0 expecttest numpy "scipy>=1.11,<2" \
    "pytest>=8,<10" "pydantic>=2.7,<3" "pydantic-settings>=2.4,<3" "PyYAML>=6,<7" \
    "typer>=0.12,<1" "rich>=13.7,<16" "filelock>=4.3.1,<5"
  echo "$work/runner"
}

relay_wheels() {  # the whole service with its selection agent; torch pinned to the CPU build
  local wheels="$work/relay/wheels"
  mkdir -p "$wheels"
  rm -f "$wheels"/ci_relay-*.whl
  rm -rf "$root/build"
  # async-timeout: redis wants it below Python 3.11.3 (Debian's 3.11.2), not on the host's.
  SOURCE_DATE_EPOCH=315532800 python3 -m pip wheel -q -w "$wheels" \
    "torch==2.13.0" "$root[agent]" "async-timeout>=4.0.3" \
    >/dev/null
  echo "$work/relay"
}

# build NAME CONTAINERFILE CONTEXT [--build-arg ...]: build unless the same inputs were built.
build() {
  local name=$1 file=$2 context=$3; shift 3
  local digest image=localhost/ci-relay-$name
  # names and sizes of the wheels, plus ci_relay's own (built reproducibly, so unchanged
  # sources give the same bytes): the same inputs reuse the image
  digest=$( (sha256sum "$file"; podman image inspect --format '{{.Id}}' "$base"; echo "$*"
             find "$context/wheels" -type f -printf '%f %s\n' | sort
             sha256sum "$context"/wheels/ci_relay-*.whl | cut -d' ' -f1) \
            | sha256sum | cut -c1-16)
  if podman image exists "$image:$digest"; then
    say "$image:$digest is up to date"
  else
    say "building $image:$digest"
    cp "$file" "$context/Containerfile"
    podman build -q --build-arg BASE="$base" "$@" -t "$image:$digest" "$context" >/dev/null
  fi
  podman tag "$image:$digest" "$image:$src" "$image:latest"  # latest: for people, not workers
  built="$image:$digest"
  # older builds of this image are superseded: free their space (in use ones stay)
  podman images --format '{{.Repository}}:{{.Tag}}' "$image" \
    | grep -v -e ":$digest\$" -e ":$src\$" -e ':latest$' | xargs -r podman rmi >/dev/null 2>&1 || true
}

for target in "${targets[@]}"; do
  case $target in
    runner-cpu)
      build runner-cpu "$root/docker/runner-cpu.Containerfile" "$(runner_wheels)" ;;
    runner-spyre-emu)  # the cpu runner plus the emulated device's test settings
      build runner-cpu "$root/docker/runner-cpu.Containerfile" "$(runner_wheels)"
      build runner-spyre-emu "$root/docker/runner-spyre-emu.Containerfile" "$work/runner" \
        --build-arg RUNNER_CPU="$built" ;;
    runner-spyre)
      ctx="$work/runner-spyre"
      rm -rf "$ctx" && cp -r "$(runner_wheels)" "$ctx"
      cp "$CI_RELAY_SPYRE_WHEELHOUSE"/*.whl "$ctx/wheels/"
      build runner-spyre "$root/docker/runner-spyre.Containerfile" "$ctx" \
        --build-arg SPYRE_BASE="$CI_RELAY_SPYRE_BASE_IMAGE" ;;
    relay)
      build relay "$root/docker/relay.Containerfile" "$(relay_wheels)" ;;
  esac
done
