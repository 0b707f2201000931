"""What ``coverage record --since`` runs again, by function or by file (issue 55, item 3).

Given a series of coverage maps of one history (each recorded at its revision, e.g. the
rolling maps ``bench_selection_history.py --coverage`` keeps in its ``--coverage-cache``),
each map is brought forward to the next one's revision on paper: the test files to run
again when a change counts for every function of the files it touched (the rule before
issue 55), and when it counts only for the functions whose bodies it changed (the rule
now), both from the same diff in the same run. No test runs: the figures are the plan of
each update (test files run again, tests kept), and the ratio of the two rules.

    python bench/bench_coverage_since.py $SCRATCH/hist/packaging $SCRATCH/cov/packaging-*.json.gz

Maps of other repositories or of revisions the clone lacks are named and left out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from test_selection.coverage.map import CoverageMap, CoverageMapError  # noqa: E402
from test_selection.coverage.update import changes_between, plan_update  # noqa: E402
from test_selection.git import GitError, Repo  # noqa: E402
from test_selection.inventory import is_test_path  # noqa: E402
from test_selection.layout import detect_layout, pytest_settings, settings_change  # noqa: E402


def _series(repo: Repo, paths: list[Path]) -> list[tuple[int, CoverageMap, Path]]:
    """The maps in history order (by how many commits lead to each revision)."""
    found = []
    for path in paths:
        try:
            cmap = CoverageMap.load(path)
            depth = int(repo.text("rev-list", "--count", "--end-of-options", cmap.revision))
        except (CoverageMapError, GitError, ValueError) as exc:
            print(f"left out {path}: {exc}", file=sys.stderr)
            continue
        found.append((depth, cmap, path))
    found.sort(key=lambda item: item[0])
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path, help="a clone of the history")
    ap.add_argument("maps", nargs="+", type=Path, help="coverage maps of that history")
    ap.add_argument("--json", type=Path, help="write each update's figures here")
    args = ap.parse_args()
    repo = Repo(args.repo)
    series = _series(repo, args.maps)
    if len(series) < 2:
        print("need at least two maps of the clone's history", file=sys.stderr)
        return 2
    rows = []
    print(
        "| from | to | changed .py | narrowed | test files | by file | by function "
        "| kept by file / function |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (_d, older, _p), (_e, newer, _q) in itertools.pairwise(series):
        began = time.perf_counter()
        changed, bodies = changes_between(repo, older.revision, newer.revision)
        seconds = time.perf_counter() - began
        patterns = detect_layout(repo, newer.revision).patterns
        listing = repo.text(
            "ls-tree", "-r", "-z", "--name-only", "--end-of-options", newer.revision
        )
        tests = {p for p in listing.split("\0") if p and is_test_path(p, patterns)}
        settings = settings_change(
            pytest_settings(repo, older.revision), pytest_settings(repo, newer.revision)
        )
        by_file = plan_update(older, changed, tests, tests.__contains__, settings)
        by_function = plan_update(older, changed, tests, tests.__contains__, settings, bodies)
        python = [p for p in changed if p.endswith(".py")]
        narrowed = sum(1 for p in python if bodies.get(p) is not None)
        files = [
            len(u.rerun) if u.rerun is not None else len(tests) for u in (by_file, by_function)
        ]
        row = {
            "from": older.revision, "to": newer.revision, "changed_python": len(python),
            "narrowed": narrowed, "test_files": len(tests), "rerun_by_file": files[0],
            "rerun_by_function": files[1], "kept_by_file": len(by_file.kept),
            "kept_by_function": len(by_function.kept), "diff_seconds": round(seconds, 3),
        }  # fmt: skip
        rows.append(row)
        print(
            f"| {older.revision[:10]} | {newer.revision[:10]} | {len(python)} | {narrowed} | "
            f"{len(tests)} | {files[0]} | {files[1]} | {len(by_file.kept)} / "
            f"{len(by_function.kept)} |"
        )
    by_file_total = sum(r["rerun_by_file"] for r in rows)
    by_function_total = sum(r["rerun_by_function"] for r in rows)
    print(
        f"\n{len(rows)} update(s): test files run again by file {by_file_total}, by function "
        f"{by_function_total} (ratio {by_function_total / max(1, by_file_total):.2f}); tests "
        f"kept by file {sum(r['kept_by_file'] for r in rows)}, by function "
        f"{sum(r['kept_by_function'] for r in rows)}; reading the diffs took "
        f"{sum(r['diff_seconds'] for r in rows):.1f} s in all"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
