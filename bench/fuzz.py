"""The fuzzing campaign, longer than the test suite runs it: cases tried, failures, time.

The same strategies and properties as tests/test_fuzz.py (tests/fuzzing.py), with more
examples, random (not derandomized) seeds, and every failure reported instead of the first:
the webhook intake, the CRCR dispatch and the HUD ingest against the real app on a fresh
PostgreSQL database, and the spec loader. Then Schemathesis over every documented endpoint
(tests/test_api_schema.py), with more examples per operation.

    python bench/fuzz.py [--examples 2000] [--schema-examples 300] [--seed N]

Needs the test suite's services (PostgreSQL on 127.0.0.1:5432; scripts/services.sh).
Prints, per target: cases, outcomes by HTTP status, failures, seconds, cases per second.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, seed, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ci_relay.context import RelayContext  # noqa: E402
from ci_relay.service.app import create_app  # noqa: E402
from tests import fuzzing  # noqa: E402
from tests.relay_fixtures import fresh_postgres_database, make_settings  # noqa: E402


def _campaign(
    name: str,
    strategy: Any,
    check: Callable[[Any, fuzzing.Tally], None],
    examples: int,
    run_seed: int,
) -> fuzzing.Tally:
    """Run ``check`` on ``examples`` drawn cases; every failing case is kept, not just one."""
    tally = fuzzing.Tally()
    failures: dict[str, str] = {}

    @seed(run_seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        try:
            check(case, tally)
        except Exception as exc:  # a property broke: note it (once per kind) and go on
            kind = f"{type(exc).__name__}: {str(exc)[:200]}"
            if kind not in failures:
                failures[kind] = f"{kind}\n  case: {str(case)[:400]}\n" + "".join(
                    traceback.format_exception(exc)[-3:]
                )

    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    tally.failures = list(failures.values())
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(tally.by_outcome.items()))
    print(
        f"{name:<26} {tally.cases:6d} cases  {len(tally.failures):3d} failure kind(s)  "
        f"{elapsed:7.1f} s  {tally.cases / elapsed:7.1f} cases/s   [{outcomes}]"
    )
    for failure in tally.failures:
        print("    " + failure.replace("\n", "\n    "))
    return tally


def _schemathesis(examples: int) -> int:
    """tests/test_api_schema.py with more examples per operation; its exit code."""
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:warnings",
            "--no-header",
            str(ROOT / "tests" / "test_api_schema.py"),
        ],
        cwd=ROOT,
        env={**os.environ, "FUZZ_SCHEMA_EXAMPLES": str(examples)},
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    name = "schemathesis (every route)"
    print(f"{name:<26} {examples} examples/operation  {elapsed:7.1f} s  {summary}")
    if proc.returncode:  # what failed, without the log lines of every rejected request
        lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith(("WARNING", "INFO"))]
        print("\n".join(lines)[-6000:])
    return proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="cases per target")
    parser.add_argument("--schema-examples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=random.randrange(2**32))
    args = parser.parse_args()
    print(f"fuzzing campaign, seed {args.seed}, {args.examples} cases per target")
    total_failures = 0
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp, fresh_postgres_database() as url:
        rt = RelayContext(
            make_settings(url, Path(tmp), hud_token=fuzzing.HUD_TOKEN, max_body_bytes=256 * 1024)
        )
        rt.db.upgrade()
        with TestClient(create_app(rt, lambda steps: None)) as client:
            targets: list[tuple[str, Any, Callable[[Any, fuzzing.Tally], None]]] = [
                (
                    "webhook intake",
                    fuzzing.webhook_requests(),
                    lambda case, t: fuzzing.check_webhook(client.post, rt, *case, t),
                ),
                (
                    "CRCR dispatch",
                    fuzzing.dispatch_requests(),
                    lambda case, t: fuzzing.check_dispatch(client.post, rt, case, t),
                ),
                (
                    "HUD ingest",
                    fuzzing.hud_bodies(),
                    lambda case, t: fuzzing.check_ingest(client.post, rt, case, t),
                ),
                (
                    "spec loader",
                    fuzzing.spec_texts(),
                    lambda case, t: fuzzing.check_spec_text(case, Path(tmp), Path(tmp), t),
                ),
            ]
            for name, strategy, check in targets:
                tally = _campaign(name, strategy, check, args.examples, args.seed)
                total_failures += len(tally.failures)
        rows = fuzzing.row_counts(rt)
        rt.db.dispose()
    print(f"rows left after the campaign: {rows}")
    schema_code = _schemathesis(args.schema_examples)
    print(
        f"{total_failures} failure kind(s) in the Hypothesis campaign; "
        f"Schemathesis {'passed' if schema_code == 0 else 'FAILED'}"
    )
    raise SystemExit(1 if total_failures or schema_code else 0)


if __name__ == "__main__":
    main()
