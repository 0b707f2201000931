"""Saved selection-bench runs: figures from per-commit rows, a run that resumes where it
stopped, and the guard that compares a run with the one saved in ``bench/results/``.

A history's replay takes longer than a session can spare, so each replayed commit's row is
appended to a progress file as it comes and a rerun skips the commits already there. The
figures a history is judged by come from its rows alone, so a table can be printed, and two
runs compared, without replaying anything.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import statistics
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

BUDGETS = (0.15, 0.05)
DROP = 0.01  # a figure that falls by more than this against the saved run fails --compare


def figures(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Pooled file and edited-test recall, the mean share, seconds cold and warm, the share
    of changes with at least one edited test in the plan, and the per-change mean of
    edited-test recall, for one setting (``key``: ``w0.1@0.15``, ``combo@0.05``...)."""
    rows = [r for r in rows if key in r["results"]]
    files = sum(len(r["results"][key]["files"]) for r in rows)
    truth = sum(len(r["truth"]) for r in rows)
    tests = sum(len(r["results"][key]["tests"]) for r in rows)
    truth_tests = sum(len(r["truth_tests"]) for r in rows)
    seconds = [r["results"][key]["seconds"] for r in rows]
    with_tests = [r for r in rows if r["truth_tests"]]
    return {
        "file": files / truth if truth else 0.0,
        "test": tests / truth_tests if truth_tests else 0.0,
        "caught": (
            sum(1 for r in with_tests if r["results"][key]["tests"]) / len(with_tests)
            if with_tests
            else 0.0
        ),
        "per_change": (
            statistics.mean(
                len(r["results"][key]["tests"]) / len(r["truth_tests"]) for r in with_tests
            )
            if with_tests
            else 0.0
        ),
        "share": statistics.mean(r["results"][key]["share"] for r in rows) if rows else 0.0,
        "cold": seconds[0] if seconds else 0.0,  # the first change replayed: nothing cached
        "warm": statistics.median(seconds[1:]) if len(seconds) > 1 else 0.0,
    }


def read_saved(path: Path) -> list[dict[str, Any]]:
    """A run saved with ``--save`` (``.json``, or ``.json.gz`` as ``bench/results/`` keeps
    them: a history's rows are mostly repeated test names)."""
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)
    if not isinstance(data, list):
        raise SystemExit(f"{path}: not a saved run (a list of histories was expected)")
    return data


def write_saved(path: Path, results: list[dict[str, Any]]) -> None:
    text = json.dumps(results, separators=(",", ":")).encode()
    path.write_bytes(gzip.compress(text, mtime=0) if path.name.endswith(".gz") else text)


class Progress:
    """One history's rows as they come (JSON lines): a rerun takes the saved ones back."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a run killed mid-write
                if record.get("settings") == settings:
                    self.rows[record["row"]["commit"]] = record["row"]
        self.settings = settings

    def get(self, commit: str) -> dict[str, Any] | None:
        return self.rows.get(commit)

    def add(self, row: dict[str, Any]) -> None:
        self.rows[row["commit"]] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"settings": self.settings, "row": row}) + "\n")


def revision(root: Path) -> str:
    """This checkout's commit (what made the figures), with a digest of its local edits:
    rows saved by other code are not taken back."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    sha = git("rev-parse", "--short=12", "HEAD") or "unknown"
    diff = git("diff", "HEAD")
    return sha + (f"+{hashlib.sha256(diff.encode()).hexdigest()[:8]}" if diff else "")


def compare(
    saved: Iterable[dict[str, Any]], fresh: Iterable[dict[str, Any]], drop: float = DROP
) -> tuple[list[str], bool]:
    """Each history's figures in ``fresh`` against the same history in ``saved``, over the
    commits both replayed and the settings both have; lines to print, and whether any
    figure fell by more than ``drop``."""
    before = {Path(r["repo"]).name: r for r in saved}
    lines = [
        "| history | setting | commits | figure | saved | now | change |",
        "|---|---|---|---|---|---|---|",
    ]
    failed = False
    for result in fresh:
        name = Path(result["repo"]).name
        old = before.get(name)
        if old is None:
            lines.append(f"| {name} | (no saved run of this history) | | | | | |")
            continue
        old_rows = {r["commit"]: r for r in old["rows"]}
        common = [r["commit"] for r in result["rows"] if r["commit"] in old_rows]
        new_rows = [r for r in result["rows"] if r["commit"] in old_rows]
        then = [old_rows[c] for c in common]
        keys = sorted(set.intersection(*(set(r["results"]) for r in [*new_rows, *then])) or set())
        for key in keys:
            a, b = figures(then, key), figures(new_rows, key)
            for figure in ("file", "test", "caught"):
                change = b[figure] - a[figure]
                worse = change < -drop
                failed |= worse
                lines.append(
                    f"| {name} | {key} | {len(common)} | {figure} | {a[figure]:.3f} | "
                    f"{b[figure]:.3f} | {change:+.3f}{' DROP' if worse else ''} |"
                )
    return lines, failed
