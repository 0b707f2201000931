"""``bench/rolling_maps.py`` (issue 45): each replayed commit gets the map the nightly before
its base's day would have recorded (the mainline commit before 00:00 UTC), or one every N
replayed commits; a refused recording leaves its commits the previous usable map."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.gitrepo import GitRepo

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str = "rolling_maps") -> ModuleType:
    """A bench module by its bare name, as the benches import one another."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _commit_at(repo: GitRepo, message: str, when: str) -> str:
    os.environ["GIT_COMMITTER_DATE"] = os.environ["GIT_AUTHOR_DATE"] = when
    try:
        return repo.commit(message, {"f.txt": message})
    finally:
        del os.environ["GIT_COMMITTER_DATE"], os.environ["GIT_AUTHOR_DATE"]


def test_each_commit_gets_the_nightly_before_its_base_and_refusals_fall_back(
    tmp_path: Path,
) -> None:
    rolling = _load()
    repo = GitRepo(tmp_path / "r")
    a = _commit_at(repo, "a", "2026-01-01T10:00:00Z")
    b = _commit_at(repo, "b", "2026-01-01T23:30:00Z")
    c = _commit_at(repo, "c", "2026-01-02T09:00:00Z")
    d = _commit_at(repo, "d", "2026-01-02T15:00:00Z")
    e = _commit_at(repo, "e", "2026-01-04T08:00:00Z")
    path = str(repo.path)
    assert rolling.nightly_revision(path, c) == b  # the last commit before Jan 2, 00:00 UTC
    assert rolling.nightly_revision(path, a) is None  # nothing before its day
    eligible = [(e, d), (d, c), (c, b), (b, a)]  # newest first, (commit, parent)
    nightly = rolling.schedule(path, eligible, "nightly")
    # the base's day decides: d's base c is on Jan 2 (map of b), e's base d too; b's base a
    # is on Jan 1 with nothing before it: the oldest base, the series' start
    assert nightly == {e: b, d: b, c: a, b: a}
    assert rolling.schedule(path, eligible, "2") == {b: a, c: a, d: c, e: c}
    recorded = rolling.Recorded(paths={a: "map-a"}, refused={b: "exit 1: collected nothing"})
    assert rolling.assign(nightly, recorded, [a, b]) == {e: "map-a", d: "map-a", c: "map-a",
                                                         b: "map-a"}  # fmt: skip
    recorded = rolling.Recorded(paths={b: "map-b"}, refused={a: "exit 1"})
    assert rolling.assign(nightly, recorded, [a, b]) == {e: "map-b", d: "map-b"}


def test_a_refused_recording_reports_the_cli_error_unwrapped(tmp_path: Path) -> None:
    rolling = _load()
    missing = tmp_path / ("a-folder-name-long-enough-to-wrap-a-narrow-terminal-" * 3)
    returncode, said = rolling.run_record(
        [sys.executable, "-m", "ci_relay", "coverage", "record", "--upstream", str(missing),
         "--rev", "abc", "-o", str(tmp_path / "m.json.gz")]
    )  # fmt: skip
    assert returncode != 0
    assert str(missing) in said and "No such file or directory" in said


def test_a_refused_map_is_kept_with_its_reason_and_said_while_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rolling = _load()
    missing = tmp_path / "no-such-upstream"
    done = rolling.record_series(str(missing), ["a" * 40], tmp_path / "cache", None, [], 30.0)
    assert done.paths == {} and list(done.refused) == ["a" * 40]
    assert "No such file or directory" in done.refused["a" * 40]
    said = capsys.readouterr().err
    assert f"map at {'a' * 12} refused: " in said and "No such file or directory" in said


def test_the_ceiling_counts_a_sweep_larger_than_the_budget_as_unreachable() -> None:
    _load("saved_runs")
    bench = _load("history_report")  # the history bench's report
    sweep = {"truth_tests": [f"t.py::test_{i}" for i in range(10)], "total": 20}
    small = {"truth_tests": ["u.py::test_a", "u.py::test_b"], "total": 100}
    # 15 % of 20 tests is 3 of the sweep's 10; the small change fits whole: 5 of 12
    assert bench.ceiling([sweep, small], 0.15) == 5 / 12
    assert bench.ceiling([small], 0.15) == 1.0
    assert bench.ceiling([], 0.15) == 0.0
