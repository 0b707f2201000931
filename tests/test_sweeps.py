"""Sweeps run whole (issue 55, item 4): a test file most of whose tests reach the change (name
a changed def, or executed a changed function) runs in full when what the budget has left
holds it; the plan says which file and why, and which did not fit. Whether it does is the
backtest's call on the repository's own commits (``SelectorConfig.sweeps`` None), or forced.
``select()`` on git repositories built here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from test_selection.agents import NoAgent
from test_selection.ranking import choice
from test_selection.ranking.allocation import SPREAD
from test_selection.ranking.candidate import Candidate
from test_selection.ranking.cases import Case
from test_selection.ranking.replay import shared_calibration
from test_selection.ranking.settings import Setting
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget
from tests.gitrepo import GitRepo

CORE = "def shape(x):\n    return (x, x)\n\n\ndef other(x):\n    return x\n"
# 12 of its 20 tests name shape(): the file is a sweep's
SHAPES = "from pkg.core import other, shape\n\n" + "\n".join(
    f"def test_s{i:02d}():\n    assert {'shape(1)' if i < 12 else 'other(1)'}\n" for i in range(20)
)
OTHERS = "from pkg.core import other\n\n" + "\n".join(
    f"def test_o{i:02d}():\n    assert other({i}) == {i}\n" for i in range(30)
)


def _plan(tmp_path: Path, budget: str, on: bool | None = True) -> Any:
    repo = GitRepo(tmp_path / "up")
    files = {"pkg/__init__.py": "", "pkg/core.py": CORE}
    repo.commit("base", {**files, "tests/test_shape.py": SHAPES, "tests/test_other.py": OTHERS})
    repo.commit("shape", {"pkg/core.py": CORE.replace("(x, x)", "(x, x, 1)")})
    config = SelectorConfig(
        budget=Budget.parse(budget), agent=NoAgent(), cache_dir=tmp_path / "cache", sweeps=on
    )
    plan, _change = select(repo.path, "HEAD~1", "HEAD", None, config)
    return plan.to_json()


def test_a_file_most_of_whose_tests_name_the_change_runs_whole(tmp_path: Path) -> None:
    off = _plan(tmp_path / "off", "20", on=False)
    assert not any(n.startswith("sweeps:") for n in off["notes"])
    assert "tests/test_shape.py::test_s19" not in {t["test"] for t in off["selected"]}
    plan = _plan(tmp_path, "20")
    chosen = {t["test"]: t for t in plan["selected"]}
    shape_tests = {f"tests/test_shape.py::test_s{i:02d}" for i in range(20)}
    assert shape_tests <= set(chosen), sorted(shape_tests - set(chosen))
    why = "12 of the 20 tests of tests/test_shape.py reach the change"
    assert chosen["tests/test_shape.py::test_s19"]["reasons"][0].startswith(why)
    assert any(
        n.startswith("sweeps: 1 of 1 test file(s)") and "tests/test_shape.py (12 of 20)" in n
        for n in plan["notes"]
    ), plan["notes"]


def test_a_sweep_the_budget_cannot_hold_is_left_to_the_ranking_and_said(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "10")
    assert len(plan["selected"]) == 10
    assert any("sweeps: 0 of 1" in n and "1 did not fit the budget" in n for n in plan["notes"])
    assert not any(
        r.startswith("12 of the 20 tests") for t in plan["selected"] for r in t["reasons"]
    )


FILES = 6
TESTS = 40  # of each module's test file
USERS = 24  # of those, the ones that call its module's def


def _history(tmp_path: Path, sweeping: bool) -> GitRepo:
    """Six modules, each with a test file of forty tests, 24 of which call the module's
    def, and a file of thirty tests every commit edits one of (it co-changes with every
    module twice as often as their own files, so history ranks it first, and it is more
    than the budget). Each commit changes one module's def; every other time it also edits
    the first test of the module's file, or with ``sweeping`` one time in two all forty (a
    sweep: those that do not name the def too)."""
    repo = GitRepo(tmp_path / ("sweeping" if sweeping else "pointed"))

    def module(k: int, n: int) -> str:
        return f"def work_{k}(x):\n    return x + {n}\n"

    def tests(k: int, n: int, edited: int) -> str:
        lines = [f"from pkg.m{k} import work_{k}\n"]
        for i in range(TESTS):
            value = n if i < edited else 0
            body = f"work_{k}({value})" if i < USERS else f"{value} + 1"
            lines.append(f"def test_{k}_{i:02d}():\n    assert {body} >= 0\n")
        return "\n\n".join(lines)

    def common(n: int) -> str:
        return "\n\n".join(
            f"def test_common_{i:02d}():\n    assert {n if i == n % 30 else 0} >= 0\n"
            for i in range(30)
        )

    files: dict[str, str | bytes | None] = {
        "pkg/__init__.py": "",
        "tests/test_common.py": common(0),
    }
    for k in range(FILES):
        files[f"pkg/m{k}.py"] = module(k, 0)
        files[f"tests/test_m{k}.py"] = tests(k, 0, 0)
    repo.commit("base", files, dedent=False)
    for n in range(1, 61):  # the backtest's anchor is a multiple of 50 commits
        k = n % FILES
        edits = {"tests/test_common.py": common(n)}
        if (n // FILES) % 2 == 0:
            sweep = sweeping and (n // FILES) % 4 == 0
            edits[f"tests/test_m{k}.py"] = tests(k, n, TESTS if sweep else 1)
        repo.commit(f"change {n}", {f"pkg/m{k}.py": module(k, n), **edits}, dedent=False)
    repo.commit("the change", {"pkg/m2.py": module(2, 99)}, dedent=False)
    return repo


def _backtest_plan(tmp_path: Path, sweeping: bool) -> Any:
    repo = _history(tmp_path, sweeping)
    config = SelectorConfig(
        budget=Budget.parse("20%"), agent=NoAgent(), cache_dir=tmp_path / "cache"
    )
    plan, _change = select(repo.path, "HEAD~1", "HEAD", None, config)
    return plan.to_json()


def test_the_plan_runs_sweeps_whole_when_the_backtest_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _backtest_plan(tmp_path / "tie", sweeping=True)
    # the replay with sweeps is listed beside the others; it found what the spread rule
    # found here (it reads the sweep's file deep anyway), so the winner stays without them
    swept = [c for c in plan["ranking"]["candidates"] if c["sweeps"]]
    assert [c["description"] for c in swept] == ["history counting + path words, sweeps run whole"]
    spread = next(
        c
        for c in plan["ranking"]["candidates"]
        if c["description"] == "history counting + path words"
    )
    assert (swept[0]["file_recall"], swept[0]["edited_test_recall"]) == (
        spread["file_recall"],
        spread["edited_test_recall"],
    )
    assert plan["ranking"]["sweeps"] is False
    assert not any(n.startswith("sweeps:") for n in plan["notes"])
    # a backtest that takes a tie for sweeps: the plan runs the sweep's file whole and says so
    monkeypatch.setattr(choice, "TIE", -1.0)
    plan = _backtest_plan(tmp_path / "taken", sweeping=True)
    assert plan["ranking"]["sweeps"] is True
    chosen = {t["test"] for t in plan["selected"]}
    assert {f"tests/test_m2.py::test_2_{i:02d}" for i in range(TESTS)} <= chosen
    assert any(n.startswith("sweeps: 1 of 1 test file(s)") for n in plan["notes"]), plan["notes"]


def _replayed(sweep_edits: int) -> tuple[Any, Any, list[tuple[str, ...]]]:
    """A backtest of 20 past commits over three test files of forty tests, the ranking
    putting A first: ten commits where A is a sweep by names and ``sweep_edits`` of its
    tests were edited, ten that edit one test of C (no sweep). Returns the backtest, the
    spread rule's figures, and each case's sweeps."""
    sizes = {"tests/test_a.py": 40, "tests/test_b.py": 40, "tests/test_c.py": 40}
    cases = []
    for k in range(20):
        if k < 10:
            truth = {"tests/test_a.py": (40, tuple(range(sweep_edits)))}
        else:
            truth = {"tests/test_c.py": (40, (0,))}
        cases.append(Case(k, f"{k:040x}", frozenset({"pkg/x.py"}), truth))
    order = ["tests/test_a.py", "tests/test_c.py", "tests/test_b.py"]
    ranked_cases = [(order, {f: r for r, f in enumerate(order)}) for _ in cases]
    backtest = choice._Backtest(cases, sizes, 0.4, 0.1)
    setting = Setting({"history": ranked_cases}, cases, shared_calibration(cases))
    backtest.measure(Candidate("history", SPREAD), "history counting", setting)
    sweeps: list[tuple[str, ...]] = [("tests/test_a.py",) if k < 10 else () for k in range(20)]
    return backtest, backtest.figures[0], sweeps


def test_the_backtest_takes_sweeps_where_they_find_more_and_not_where_they_cost() -> None:
    backtest, best, sweeps = _replayed(sweep_edits=40)
    taken = choice._sweeps(backtest, best, sweeps)
    # the spread rule reads part of A in a sweep; running it whole finds every edited test
    assert taken.candidate.sweeps and taken.test_recall > best.test_recall, (best, taken)
    assert taken.file_recall == best.file_recall == 1.0
    assert taken.label == "history counting, sweeps run whole"
    assert backtest.calibrations[taken.key] is backtest.calibrations[best.key]
    # the same files, but the commits edit one test of A: whole files spend the budget for
    # nothing, and the winner stays as it was
    backtest, best, sweeps = _replayed(sweep_edits=1)
    kept = choice._sweeps(backtest, best, sweeps)
    assert kept is best and not kept.candidate.sweeps
    # without a sweep in any case there is nothing to replay
    assert choice._sweeps(backtest, best, [()] * 20) is best
