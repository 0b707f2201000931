"""Overhead of ``ci-relay run`` over plain pytest on the same tests.

Builds the sample upstream, asks ``ci-relay specs show`` which variants the
bundled specs execute, then times (alternating, several rounds) a subprocess
``ci-relay run`` against a subprocess ``pytest`` given exactly those node ids
with the same pytest options. Prints medians and the ratio (goal <= 1.05).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ci_relay.sample_upstream import build_sample_upstream

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "reuse_specs" / "specs").glob("*.yaml"))


def _timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"{cmd[:4]}... exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        work = Path(tmp)
        upstream = build_sample_upstream(work / "upstream").path
        spec_args = [a for spec in SPECS for a in ("--spec", str(spec))]
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "ci_relay",
                "specs",
                "show",
                *map(str, SPECS),
                "--upstream",
                str(upstream),
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows = json.loads(shown.stdout)
        executed = [str(upstream / r["nodeid"]) for r in rows if r["mode"] != "skip"]
        (work / "pytest.ini").write_text("[pytest]\n")
        relay = [
            sys.executable,
            "-m",
            "ci_relay",
            "run",
            *spec_args,
            "--upstream",
            str(upstream),
            "--junit",
            str(work / "relay.xml"),
        ]
        plain = [
            sys.executable,
            "-B",
            "-m",
            "pytest",
            *executed,
            "-c",
            str(work / "pytest.ini"),
            "--rootdir",
            str(upstream),
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "junit_family=xunit2",
            "--junitxml",
            str(work / "plain.xml"),
        ]
        print(f"{len(rows)} variants covered, {len(executed)} executed; {args.rounds} rounds")
        relay_times: list[float] = []
        plain_times: list[float] = []
        _timed(plain, work)  # warm the page cache for both
        for i in range(args.rounds):
            plain_times.append(_timed(plain, work))
            relay_times.append(_timed(relay, work))
            print(
                f"  round {i + 1}: pytest {plain_times[-1]:.2f}s"
                f"  ci-relay run {relay_times[-1]:.2f}s"
            )
        plain_med = statistics.median(plain_times)
        relay_med = statistics.median(relay_times)
        print(f"median pytest {plain_med:.2f}s, ci-relay run {relay_med:.2f}s")
        print(f"ratio ci-relay run / pytest = {relay_med / plain_med:.3f} (goal <= 1.05)")


if __name__ == "__main__":
    main()
