"""``bench/saved_runs.py`` (issue 55, item 7): a history's replay resumes from the rows it
saved as they came (only with the same settings and code), its figures come from the rows
alone, and ``--compare`` fails when a figure falls by more than 0.01 against the saved run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.test_bench_rolling_maps import BENCH, _load


def _row(commit: str, found: list[str], truth: list[str]) -> dict[str, Any]:
    result = {"files": ["t.py"], "tests": found, "share": 0.15, "seconds": 1.0}
    return {
        "commit": commit,
        "truth": ["t.py"],
        "truth_tests": truth,
        "truth_cost": len(truth),
        "total": 100,
        "cochanged": ["t.py"],
        "results": {"w0.1@0.15": result, "w0.1@0.05": {**result, "tests": found[:1]}},
    }


def test_rows_are_taken_back_only_with_the_same_settings_and_a_torn_line_is_skipped(
    tmp_path: Path,
) -> None:
    saved = _load("saved_runs")
    path = tmp_path / "attrs.jsonl"
    first = saved.Progress(path, {"commits": 100, "code": "abc"})
    first.add(_row("c1", ["t.py::a"], ["t.py::a"]))
    with path.open("a") as out:
        out.write('{"settings": {"commits": 100, "code": "abc"}, "row": {"comm')  # killed
    again = saved.Progress(path, {"commits": 100, "code": "abc"})
    assert again.get("c1") == _row("c1", ["t.py::a"], ["t.py::a"]) and again.get("c2") is None
    assert saved.Progress(path, {"commits": 100, "code": "def"}).get("c1") is None


def test_figures_count_changes_caught_and_the_per_change_mean() -> None:
    saved = _load("saved_runs")
    rows = [
        _row("c1", ["t.py::a"], ["t.py::a", "t.py::b", "t.py::c", "t.py::d"]),
        _row("c2", [], ["t.py::e"]),
        _row("c3", ["t.py::f", "t.py::g"], ["t.py::f", "t.py::g"]),
    ]
    fig = saved.figures(rows, "w0.1@0.15")
    assert fig["test"] == 3 / 7  # pooled: the sweep of c1 weighs most
    assert fig["caught"] == 2 / 3 and fig["per_change"] == (0.25 + 0 + 1) / 3


def test_compare_fails_on_a_drop_over_the_tolerance_on_common_commits(tmp_path: Path) -> None:
    before = [
        {"repo": "/x/attrs", "rows": [_row("c1", ["t.py::a", "t.py::b"], ["t.py::a", "t.py::b"])]}
    ]
    same = [
        {
            "repo": "/elsewhere/attrs",
            "rows": [
                _row("c1", ["t.py::a", "t.py::b"], ["t.py::a", "t.py::b"]),
                _row("c9", [], ["t.py::z"]),  # not in the saved run: not compared
            ],
        }
    ]
    worse = [{"repo": "/x/attrs", "rows": [_row("c1", ["t.py::a"], ["t.py::a", "t.py::b"])]}]
    saved_path, now_path = tmp_path / "saved.json", tmp_path / "now.json"
    saved_path.write_text(json.dumps(before))
    for results, code in ((same, 0), (worse, 1)):
        now_path.write_text(json.dumps(results))
        done = subprocess.run(
            [sys.executable, str(BENCH / "bench_selection_history.py"), "--load",
             str(now_path), "--compare", str(saved_path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == code, done.stdout + done.stderr
        assert "| attrs | w0.1@0.15 | 1 | test | 1.000 |" in done.stdout
    assert "| attrs | w0.1@0.15 | 1 | test | 1.000 | 0.500 | -0.500 DROP |" in done.stdout
