#!/usr/bin/env bash
# Build ci-relay's images without a registry: a Debian base from debootstrap, Python packages
# from a local wheelhouse. Reuses an image whose inputs did not change (tagged by digest).
# Usage: build_images.sh REPO_ROOT [--refresh] [--backends-dir DIR]... TARGET...
# TARGET: runner-BACKEND | relay | redis | postgres. A runner image is rendered from the
# backend's declaration (bundled in reuse_specs/backend_declarations/, or in a --backends-dir
# folder: `ci-relay images build` passes the relay's) through the one
# template docker/runner.Containerfile (ci_relay/execution/runner_image.py); a declaration may
# require inputs that are not public (runner-spyre: CI_RELAY_SPYRE_BASE_IMAGE and
# CI_RELAY_SPYRE_WHEELHOUSE) and the build refuses clearly without them. redis and postgres
# are the compose stack's services, from Debian's packages (no registry needed).
set -euo pipefail
root=$1; shift
refresh=0  # --refresh: resolve the wheels again even if the checkout's inputs are unchanged
if [ "${1:-}" = --refresh ]; then refresh=1; shift; fi
folders=()  # --backends-dir DIR: declarations beside the bundled ones
while [ "${1:-}" = --backends-dir ]; do folders+=(--backends-dir "$2"); shift 2; done
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(runner-cpu)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/docker/containers.conf}
work=${CI_RELAY_IMAGE_WORK:-/var/tmp/ci-relay-images}
mkdir -p "$work"
say() { echo "images: $*" >&2; }
# quietly COMMAND...: the installer's chatter (pip warns about every find-links folder this
# machine's configuration names) goes to a log, printed only when the command fails
quietly() {
  if ! "$@" >"$work/installer.log" 2>&1; then
    cat "$work/installer.log" >&2
    say "failed: $1 ... (its output above, kept in $work/installer.log)"
    return 1
  fi
}
# the tag a worker asks for: the digest of the ci-relay sources the image runs
src=$(PYTHONPATH="$root" python3 -m ci_relay.source_digest "$root")
# everything the builds read from the checkout (see build)
inputs=$(PYTHONPATH="$root" python3 -m ci_relay.source_digest --inputs "$root")
# each runner's rendered Containerfile and build plan (not in $work: nothing is kept there
# for an image that is already up to date)
plans=$(mktemp -d)
trap 'rm -rf "$plans"' EXIT

plan() {  # plan BACKEND: render its Containerfile and plan into $plans/BACKEND, its parents
  # too; refuse when an input its declaration requires (image.requires.env) is not given
  local name=$1 from_backend requires var line
  [ -f "$plans/$name/vars" ] && return 0
  mkdir -p "$plans/$name"
  PYTHONPATH="$root" python3 -m ci_relay.execution.runner_image "$root" "$name" "$plans/$name" \
    ${folders[@]+"${folders[@]}"} >"$plans/$name/vars" || exit 2
  from_backend=$(. "$plans/$name/vars"; echo "$from_backend")
  requires=$(. "$plans/$name/vars"; echo "$requires")
  for var in $requires; do
    if [ -z "${!var:-}" ]; then
      while IFS= read -r line; do say "$line"; done <"$plans/$name/refusal"
      exit 2
    fi
  done
  if [ -n "$from_backend" ]; then plan "$from_backend"; fi
}
expand() {  # expand VALUE REQUIRES: ${VAR} of the declared variables only, from the environment
  local value=$1 var
  for var in $2; do value=${value//"\${$var}"/${!var}}; done
  echo "$value"
}

for target in "${targets[@]}"; do  # refuse before any slow step
  case $target in
    relay|redis|postgres) ;;
    runner-*) plan "${target#runner-}" ;;
    *)
      say "unknown image $target (known: runner-BACKEND relay redis postgres)"
      exit 2 ;;
  esac
done

debian_base() {  # debian_base PACKAGES: a bookworm image with them, made with debootstrap once
  local packages=$1 image rootfs log
  image=localhost/ci-relay-base:bookworm-$(echo "$packages" | sha256sum | cut -c1-8)
  if ! podman image exists "$image"; then
    say "building $image with debootstrap (a few minutes)"
    rootfs=$(mktemp -d "$work/rootfs.XXXX")
    log="$work/debootstrap-${image##*-}.log"
    debootstrap --variant=minbase --include="$packages" \
      bookworm "$rootfs" http://deb.debian.org/debian >"$log" 2>&1 \
      || { say "debootstrap failed, see $log"; rm -rf "$rootfs"; exit 1; }
    tar -C "$rootfs" -c . | podman import -q - "$image" >/dev/null
    rm -rf "$rootfs"
  fi
  echo "$image"
}
# Runner images need only Python; the relay also needs git (its upstream mirrors).
python_base() { debian_base python3,python3-venv,ca-certificates,passwd,git${1:+,$1}; }
services_base() { debian_base postgresql-15,redis-server,passwd; }

# Each context has wheels/ (the dependencies: one image layer, cached while they are the same)
# and own/ (ci-relay's wheel: the layer a source change rebuilds).
own_wheel() {  # own_wheel CONTEXT: ci-relay's wheel, built reproducibly, alone in CONTEXT/own
  rm -rf "$1/own" "$root/build"  # setuptools never prunes build/lib: a deleted module would ship
  mkdir -p "$1/own"
  SOURCE_DATE_EPOCH=315532800 quietly python3 -m pip wheel -q --no-deps -w "$1/own" "$root"
}

# What a wheelhouse was resolved from: the dependency ranges (pyproject.toml) and this script
# (the pins it asks for). A source change keeps it: resolving again takes most of a minute.
wheels_key() { cat "$root/pyproject.toml" "$root/ci_relay/execution/build_images.sh" | sha256sum | cut -c1-16; }
wheels_current() {  # wheels_current DIR: resolved from the same inputs (and not --refresh)
  [ "$refresh" = 0 ] && [ -f "$1.resolved" ] && [ "$(cat "$1.resolved")" = "$(wheels_key)" ]
}

runner_wheels() {  # torch and the runner side of ci-relay (its own wheel without dependencies)
  local wheels="$work/runner/wheels"
  mkdir -p "$wheels"
  rm -f "$wheels"/ci_relay-*.whl
  own_wheel "$work/runner"
  if ! wheels_current "$wheels"; then
    rm -f "$wheels.resolved"
    quietly python3 -m pip download -q -d "$wheels" torch==2.13.0 expecttest numpy "scipy>=1.11,<2" \
      "pytest>=8,<10" "pydantic>=2.7,<3" "pydantic-settings>=2.4,<3" "PyYAML>=6,<7" \
      "typer>=0.12,<1" "rich>=13.7,<16" "filelock>=4.3.1,<5"
    wheels_key >"$wheels.resolved"
  fi
  echo "$work/runner"
}

relay_wheels() {  # the whole service with its selection agent; torch pinned to the CPU build
  local wheels="$work/relay/wheels"
  own_wheel "$work/relay"
  if ! wheels_current "$wheels"; then
    rm -rf "$wheels" "$wheels.resolved" && mkdir -p "$wheels"  # exactly the deps: all installed
    # async-timeout: redis wants it below Python 3.11.3 (Debian's 3.11.2), not on the host's.
    SOURCE_DATE_EPOCH=315532800 quietly python3 -m pip wheel -q -w "$wheels" \
      "torch==2.13.0" "$root[agent]" "async-timeout>=4.0.3"
    rm -f "$wheels"/ci_relay-*.whl  # its own layer (own/)
    wheels_key >"$wheels.resolved"
  fi
  echo "$work/relay"
}

# build NAME CONTAINERFILE CONTEXT_COMMAND [--build-arg ...]: build unless the same inputs
# were built. Two keys: the checkout's inputs (tag in-KEY, checked first and cheaply: the
# wheels are not resolved again) and, once the wheels are fetched, their content (tag KEY:
# a rebuild that fetched the same wheels reuses the image).
build() {
  local name=$1 file=$2 make_context=$3; shift 3
  local key digest context image=localhost/ci-relay-$name
  # with the Containerfile, the files of docker/ it copies (named after the image: NAME-*)
  key=in-$( (echo "$inputs"; file_hashes "$file" "$root/docker/$name"-*
             base_id
             echo "$*"; parent_ids "$@"; if [ -n "$wheels" ]; then file_hashes "$wheels"/*; fi) \
            | sha256sum | cut -c1-16)
  if [ "$refresh" = 0 ] && podman image exists "$image:$key"; then
    say "$image:$key is up to date (same inputs; --refresh fetches the wheels again)"
    digest=$key
  else
    context=$("$make_context")
    # names and sizes of the wheels, plus ci_relay's own (built reproducibly, so unchanged
    # sources give the same bytes): the same inputs reuse the image
    digest=$( (file_hashes "$file"; base_id; echo "$*"
               parent_ids "$@"; find "$context" -type f ! -name Containerfile -printf '%P %s\n' | sort
               { cat "$context"/own/ci_relay-*.whl "$context"/*.sh 2>/dev/null || true; } | sha256sum) \
              | sha256sum | cut -c1-16)
    if podman image exists "$image:$digest"; then
      say "$image:$digest is up to date (the same wheels)"
    else
      say "building $image:$digest"
      cp "$file" "$context/Containerfile"
      # --layers: the dependency layer comes from the cache when only ci-relay changed
      podman build -q --layers --build-arg BASE="$base" "$@" -t "$image:$digest" "$context" >/dev/null
    fi
    podman tag "$image:$digest" "$image:$key"
  fi
  podman tag "$image:$key" "$image:$src" "$image:latest"  # latest: for people, not workers
  built="$image:$key"
  # older builds of this image are superseded: free their space (in use ones stay)
  podman images --format '{{.Repository}}:{{.Tag}}' "$image" \
    | grep -v -e ":$digest\$" -e ":$key\$" -e ":$src\$" -e ':latest$' \
    | xargs -r podman rmi >/dev/null 2>&1 || true
}

base_id() {  # the base image's id; a vendor image not pulled yet: its name (the build pulls it)
  podman image inspect --format '{{.Id}}' "$base" 2>/dev/null || echo "$base"
}
file_hashes() {  # name and content of each existing file, not where the checkout is
  local f
  for f in "$@"; do
    if [ -f "$f" ]; then echo "${f##*/} $(sha256sum <"$f")"; fi
  done
}
parent_ids() {  # the image ids of local images named in build args (a rebuilt parent)
  local arg
  for arg in "$@"; do
    case $arg in *=localhost/*) podman image inspect --format '{{.Id}}' "${arg#*=}" ;; esac
  done
}
runner_context() {  # a runner's context: the shared wheelhouse (or none on another runner
  # image), plus the wheels folder its declaration names
  local ctx="$work/runner-$backend"
  if [ -z "$from_backend" ] && [ -z "$wheels" ]; then runner_wheels; return; fi
  rm -rf "$ctx"
  if [ -z "$from_backend" ]; then cp -r "$(runner_wheels)" "$ctx"; else mkdir -p "$ctx/wheels"; fi
  if [ -n "$wheels" ]; then cp "$wheels"/*.whl "$ctx/wheels/"; fi
  echo "$ctx"
}
service_context() {  # redis, postgres: the service's own scripts from docker/, no wheels
  local ctx="$work/$name"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp "$root/docker/$name"-*.sh "$ctx/" 2>/dev/null || true
  echo "$ctx"
}

build_runner() {  # build_runner BACKEND: its parent runner first (from_backend), then its own
  local backend=$1 from_backend base_image wheels debian requires
  eval "$(cat "$plans/$backend/vars")"
  base_image=$(expand "$base_image" "$requires")
  wheels=$(expand "$wheels" "$requires")
  if [ -n "$wheels" ] && [ ! -d "$wheels" ]; then say "runner-$backend: no wheels folder $wheels"; exit 2; fi
  if [ -n "$from_backend" ]; then
    build_runner "$from_backend"
    base=$built
  elif [ -n "$base_image" ]; then
    base=$base_image
  else
    base=$(python_base "$debian")
  fi
  build "runner-$backend" "$plans/$backend/Containerfile" runner_context
}

for target in "${targets[@]}"; do
  wheels=""
  case $target in
    redis|postgres)
      base=$(services_base)
      build "$target" "$root/docker/$target.Containerfile" service_context ;;
    relay)
      base=$(python_base)
      build relay "$root/docker/relay.Containerfile" relay_wheels ;;
    runner-*)
      build_runner "${target#runner-}" ;;
  esac
done
