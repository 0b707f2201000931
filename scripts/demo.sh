#!/usr/bin/env bash
# Quick start, command 1: set up, build the sample upstream and run the bundled
# Spyre reuse specs on it with the cpu backend; prints the results.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m ci_relay demo "$@"
