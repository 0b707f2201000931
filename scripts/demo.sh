#!/usr/bin/env bash
# Quick start, command 1: set up, start the relay in embedded mode (SQLite, server-less
# broker, API and worker together) and feed it one signed pull_request for a sample upstream
# commit; prints the results and the URL where they are. Extra arguments go to `ci-relay demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m ci_relay demo "$@"
