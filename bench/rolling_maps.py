"""Coverage maps for the selection bench: one recorded before the replayed window (the
one-off map), and a rolling series as fresh as the relay's (issue 45).

The relay selects with the newest nightly's map: a night old. The rolling series gives each
replayed commit the map the nightly before its base would have recorded: the newest commit of
the history's mainline (first parents from HEAD) committed before 00:00 UTC of the base's
day. ``--coverage-every N`` instead records one every N replayed commits (at the parent of
the oldest of each run of N). Each map after the first is recorded with ``ci-relay coverage
record --since`` the one before it, so only the test files a change can reach run again.

A recording that is refused (it recorded nothing, or pytest could not collect) does not end
the series: the commits it would have served keep the previous map, as the relay does, and
the bench counts them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NIGHTLY = "nightly"


def git(repo: str, *args: str, check: bool = True) -> str:
    """git in ``repo``, dates in UTC (the nightly's day is a UTC day)."""
    return subprocess.run(
        ["git", "-C", repo, *args],
        capture_output=True,
        text=True,
        check=check,
        env={**os.environ, "TZ": "UTC"},
    ).stdout


def run_record(command: list[str]) -> tuple[int, str]:
    """Run a ``ci-relay coverage record`` command: its exit code and the last lines it
    printed, on one line. The terminal width is set wide so the CLI's error text arrives
    unwrapped (a wrapped message read as "No / such file")."""
    ran = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"},
    )
    lines = [line.strip(" │╭╮╰╯─") for line in (ran.stdout + ran.stderr).splitlines()]
    return ran.returncode, " ".join(line for line in lines if line)[-500:]


def nightly_revision(repo: str, base: str) -> str | None:
    """The mainline commit the nightly before ``base``'s day would have recorded at."""
    day = git(repo, "show", "-s", "--format=%cd", "--date=format-local:%Y-%m-%d", base).strip()
    found = git(
        repo, "rev-list", "-1", "--first-parent", f"--before={day}T00:00:00Z", "HEAD", check=False
    ).strip()
    return found or None


def schedule(repo: str, eligible: list[tuple[Any, ...]], every: str) -> dict[str, str]:
    """Replayed commit -> the revision of the map it selects with (``eligible`` newest first,
    as the yardstick lists them: (commit, parent, ...))."""
    oldest_first = list(reversed(eligible))
    out: dict[str, str] = {}
    if every == NIGHTLY:
        first = oldest_first[0][1]
        for commit, parent, *_rest in oldest_first:
            out[commit] = nightly_revision(repo, parent) or first
        return out
    n = max(1, int(every))
    for start in range(0, len(oldest_first), n):
        run = oldest_first[start : start + n]
        for commit, *_rest in run:
            out[commit] = run[0][1]
    return out


@dataclass
class Recorded:
    """The maps of one history, and what became of each recording."""

    paths: dict[str, str] = field(default_factory=dict)  # revision -> map file (usable)
    refused: dict[str, str] = field(default_factory=dict)  # revision -> why
    seconds: float = 0.0
    reused: int = 0  # tests kept from the previous map, over the series
    rerun: int = 0  # tests recorded again

    def to_json(self) -> dict[str, Any]:
        return {
            "paths": self.paths,
            "refused": self.refused,
            "seconds": round(self.seconds, 1),
            "reused": self.reused,
            "rerun": self.rerun,
        }


def record_series(
    repo: str,
    revisions: list[str],
    cache: Path,
    python: str | None,
    pytest_args: list[str],
    timeout: float,
) -> Recorded:
    """Record a map at each revision (oldest first), each after the first ``--since`` the
    previous usable one; maps already in ``cache`` are reused."""
    from test_selection.coverage.map import CoverageMap, CoverageMapError

    name = Path(repo).name
    done = Recorded()
    previous: Path | None = None
    for k, revision in enumerate(revisions):
        target = cache / f"{name}-{revision[:12]}.json.gz"
        if not target.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            command = [
                sys.executable, "-m", "ci_relay", "coverage", "record", "--upstream", repo,
                "--rev", revision, "-o", str(target), "--timeout", str(timeout),
                *(["--python", python] if python else []),
                *(["--since", str(previous)] if previous else []), "--", *pytest_args,
            ]  # fmt: skip
            print(
                f"  {name}: map {k + 1}/{len(revisions)} at {revision[:12]}"
                + (" (since the previous)" if previous else ""),
                file=sys.stderr,
                flush=True,
            )
            began = time.perf_counter()
            returncode, said = run_record(command)
            done.seconds += time.perf_counter() - began
            if returncode != 0 or not target.is_file():
                done.refused[revision] = f"exit {returncode}: {said}"
                _say_refused(name, revision, done.refused[revision])
                continue
        try:
            cmap = CoverageMap.load(target)
        except CoverageMapError as exc:
            done.refused[revision] = str(exc)
            _say_refused(name, revision, done.refused[revision])
            continue
        done.paths[revision] = str(target)
        done.reused += cmap.reused
        done.rerun += len(cmap.tests) - cmap.reused
        previous = target
    return done


def _say_refused(name: str, revision: str, why: str) -> None:
    """One line per refused map, its reason from the CLI's ``error:`` on when it gave one,
    so that a run whose maps were refused says why while it runs, not only in ``--save``."""
    at = why.find("error:")
    print(
        f"  {name}: map at {revision[:12]} refused: {why[at:] if at >= 0 else why}"[:400],
        file=sys.stderr,
        flush=True,
    )


def assign(wanted: dict[str, str], recorded: Recorded, order: list[str]) -> dict[str, str]:
    """Replayed commit -> map file: its scheduled map, or when that recording was refused the
    newest usable one before it (``order``: the revisions oldest first)."""
    out: dict[str, str] = {}
    for commit, revision in wanted.items():
        at = order.index(revision)
        for candidate in reversed(order[: at + 1]):
            if candidate in recorded.paths:
                out[commit] = recorded.paths[candidate]
                break
    return out
