"""Sweeps run whole (issue 55, item 4; off by default until the backtest sets the share, see
``SelectorConfig.sweeps``): a test file most of whose tests reach the change (name a changed
def, or executed a changed function) runs in full when what the budget has left holds it;
the plan says which file and why, and which did not fit. ``select()`` on a git repository
built here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_selection.agents import NoAgent
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


def _plan(tmp_path: Path, budget: str, on: bool = True) -> Any:
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
