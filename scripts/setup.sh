#!/usr/bin/env bash
# Install everything ci-relay needs into the current Python, idempotently.
# torch is pinned to 2.13.0 first: an unpinned resolve could pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

command -v git >/dev/null || { echo "setup: git is required (apt-get install git)" >&2; exit 1; }
if ! command -v bwrap >/dev/null; then  # the sandbox runtime
  echo "setup: installing bubblewrap" >&2
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; })
  else
    echo "setup: bubblewrap missing and not root; the sandbox runtime will be unavailable" >&2
  fi
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.__version__.startswith("2.13.") else 1)' 2>/dev/null; then
  echo "setup: installing torch 2.13.0 (CPU)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
fi
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[torch,agent,dev]"
