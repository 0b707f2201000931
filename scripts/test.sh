#!/usr/bin/env bash
# Quick start, command 2 (and what CI runs): set up, start Redis and PostgreSQL if down,
# lint, type-check, run the test suite in parallel. Prints each set-up phase's seconds and
# pytest's 25 slowest tests.
#
#   bash scripts/test.sh            the full suite (CI runs exactly this)
#   bash scripts/test.sh --quick    the inner loop: no container image, no browser, no real
#                                   upstream test session (skips the image build too)
# Other arguments go to pytest (e.g. -k NAME, -x, tests/test_x.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
QUICK=0
args=()
for arg in "$@"; do
  if [ "$arg" = "--quick" ]; then QUICK=1; else args+=("$arg"); fi
done

phases=()
phase() {  # phase NAME COMMAND...: run it, remember how long it took
  local name=$1 start end tenths
  shift
  echo "== $name"
  start=${EPOCHREALTIME/./}
  "$@"
  end=${EPOCHREALTIME/./}
  tenths=$(((end - start) / 100000))
  phases+=("$(printf '%-10s %5d.%d s' "$name" $((tenths / 10)) $((tenths % 10)))")
}

phase setup bash scripts/setup.sh
phase services bash scripts/services.sh
if [ "$QUICK" = 0 ]; then
  phase images "$PY" -m ci_relay images build --backend cpu --backend spyre-emu --relay --services
fi
phase ruff sh -c "\"$PY\" -m ruff check . && \"$PY\" -m ruff format --check ."
BIN=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
phase workflows sh -c "\"$BIN/actionlint\" -config-file workflows/actionlint.yaml workflows/*.yml && \"$BIN/zizmor\" --offline --quiet --no-progress workflows/*.yml"
# bytecode (pytest's rewritten modules too) goes to a cache outside the checkout and every
# upstream tree, so each of the suite's processes and CLI runs compiles a module only once
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/ci-relay/pycache}
unset PYTHONDONTWRITEBYTECODE
# mypy's cache outside the checkout: a fresh clone (CI) checks only what changed
export MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ci-relay/mypy}
phase mypy "$PY" -m mypy
echo "== set-up phases"
printf '   %s\n' "${phases[@]}"
# most tests wait on child processes, sockets and containers: more workers than cores
WORKERS=${CI_RELAY_TEST_WORKERS:-$(($(nproc) + 1))}
echo "== pytest ($WORKERS workers)"
if [ "$QUICK" = 1 ]; then
  export FUZZ_SCHEMA_EXAMPLES=${FUZZ_SCHEMA_EXAMPLES:-8}  # every endpoint, fewer examples
  exec "$PY" -m pytest -n "$WORKERS" --dist loadgroup \
    -m "not slow and not container and not browser" "${args[@]}"
fi
exec "$PY" -m pytest -n "$WORKERS" --dist loadgroup "${args[@]}"
