#!/usr/bin/env bash
# Quick start, command 2 (and what CI runs): set up, start Redis and PostgreSQL if down,
# lint, type-check, run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/setup.sh
bash scripts/services.sh
echo "== images" && "$PY" -m ci_relay images build --backend cpu --backend spyre-emu --relay
echo "== ruff" && "$PY" -m ruff check . && "$PY" -m ruff format --check .
echo "== workflows" && BIN=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))') && "$BIN/actionlint" -config-file workflows/actionlint.yaml workflows/*.yml && "$BIN/zizmor" --offline --quiet --no-progress workflows/*.yml
echo "== mypy" && "$PY" -m mypy
echo "== pytest" && exec "$PY" -m pytest "$@"
