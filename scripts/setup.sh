#!/usr/bin/env bash
# Install everything ci-relay needs into the current Python, idempotently.
# torch is pinned to 2.13.0 first: an unpinned resolve could pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# the installers' own output (warnings about this machine's package mirrors and the like) goes
# to this log, printed only when an install fails
mkdir -p .ci-relay
log=.ci-relay/setup.log
: > "$log"
quietly() {  # quietly COMMAND...: run it with its output in $log; on failure print the log
  if ! "$@" >>"$log" 2>&1; then
    echo "setup: failed: $*" >&2
    cat "$log" >&2
    echo "setup: (this output is kept in $log)" >&2
    exit 1
  fi
}

command -v git >/dev/null || { echo "setup: git is required (apt-get install git)" >&2; exit 1; }
# runtimes: bubblewrap (sandbox), Podman + runc (container), debootstrap (runner base image)
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v curl >/dev/null || missing+=(curl)
# dashboard browser tests: Debian's Chromium, driven by Playwright (never `playwright install`)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "${missing[@]}" >>"$log" 2>&1 \
      || { quietly apt-get update -qq && quietly apt-get install -y -qq "${missing[@]}"; }
  else
    echo "setup: not root; the sandbox/container runtimes may be unavailable" >&2
  fi
fi
# the Python packages: skipped when this checkout installed them from this pyproject.toml
# into this Python (a fresh clone, CI's case, always installs)
stamp=.ci-relay/setup.stamp
want=$({ cat pyproject.toml; command -v "$PY"; pwd -P; } | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$PY" -c '
import importlib.metadata as m, importlib.util as u, pathlib, sys
spec = u.find_spec("ci_relay")
here = pathlib.Path.cwd().resolve()
ours = spec is not None and pathlib.Path(spec.origin).resolve().is_relative_to(here)
sys.exit(0 if ours and m.version("torch").startswith("2.13.") else 1)' 2>/dev/null; then
  echo "setup: packages up to date (pyproject.toml unchanged since this checkout installed them)"
  exit 0
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.__version__.startswith("2.13.") else 1)' 2>/dev/null; then
  echo "setup: installing torch 2.13.0 (CPU)" >&2
  quietly "$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
fi
echo "setup: installing ci-relay and its Python dependencies (installer output: $log)" >&2
quietly "$PY" -m pip install --quiet --disable-pip-version-check -e ".[torch,agent,dev]"
echo "$want" > "$stamp"
