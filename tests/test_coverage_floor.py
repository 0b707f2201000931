"""The coverage floor (issue 55, item 2): every changed function a map knows gets its most
specific executing test into the plan, at any budget, ahead of the ranking; a floor larger
than the budget keeps its most specific part and says so; a map off the change's line of
history makes no floor and says why. Maps recorded by the real recorder on real git
repositories built here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from test_selection.coverage.floor import floor_for
from test_selection.coverage.map import CoverageMap
from test_selection.plan import make_plan
from test_selection.types import FLOOR_SOURCE, Budget, Evidence, Scored, TestId
from tests.conftest import CliResult
from tests.gitrepo import GitRepo
from tests.test_coverage_map import dispatcher

N = 40

CORE = dispatcher(N)
# every test reads alike; one more runs every implementation (it reaches everything, so it
# is the least specific test for any of them)
TESTS = (
    "from pkg.core import dispatch\n\n"
    + "\n".join(
        f"def test_case_{i:02d}():\n    assert dispatch({i}) == {i} * {i + 2}\n" for i in range(N)
    )
    + f"\ndef test_all():\n    assert [dispatch(i) for i in range({N})]\n"
)
UTIL = "def double(x):\n    return 2 * x\n"


def _upstream(tmp_path: Path) -> tuple[GitRepo, str]:
    repo = GitRepo(tmp_path / "up")
    repo.git("remote", "add", "origin", "https://github.com/example/floor.git")
    base = repo.commit(
        "base",
        {
            "pkg/__init__.py": "",
            "pkg/core.py": CORE,
            "pkg/util.py": UTIL,
            "tests/test_core.py": TESTS,
        },
        dedent=False,
    )
    return repo, base


def _record(cli: Callable[..., CliResult], repo: GitRepo, rev: str, out: Path) -> None:
    done = cli("coverage", "record", "--upstream", repo.path, "--rev", rev, "-o", out)
    assert done.code == 0, done.output


@pytest.fixture(scope="module")
def base_map(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The upstream at its base and its map, recorded once for the module (a recording
    costs seconds); each test works on a copy of the checkout."""
    root = tmp_path_factory.mktemp("floor")
    repo, base = _upstream(root)
    cmap = root / "map.json.gz"
    proc = subprocess.run(
        [sys.executable, "-m", "ci_relay", "coverage", "record", "--upstream", str(repo.path),
         "--rev", base, "-o", str(cmap)],
        capture_output=True, text=True, check=False, cwd=root, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return repo.path, cmap


def _recorded_copy(base_map: tuple[Path, Path], tmp_path: Path) -> tuple[GitRepo, Path]:
    shutil.copytree(base_map[0], tmp_path / "up")
    return GitRepo(tmp_path / "up"), base_map[1]


def _plan(cli: Callable[..., CliResult], repo: GitRepo, cmap: Path, budget: str) -> Any:
    done = cli(
        "select", "--upstream", repo.path, "--base", "HEAD~1", "--head", "HEAD",
        "--budget", budget, "--agent", "none", "--json", "--coverage", cmap,
    )  # fmt: skip
    assert done.code == 0, done.output
    return json.loads(done.stdout)


def _edit(*impls: int) -> str:
    core = CORE
    for i in impls:
        core = core.replace(f"n * {i + 2}\n", f"n * {i + 2} + 0\n")
    return core


def test_a_function_only_one_test_reaches_gets_that_test_at_one_percent(
    base_map: tuple[Path, Path], tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, cmap = _recorded_copy(base_map, tmp_path)
    repo.commit(
        "fix 23, add a helper no test runs",
        {"pkg/core.py": _edit(23), "pkg/util.py": UTIL + "\ndef halve(x):\n    return x / 2\n"},
        dedent=False,
    )
    plan = _plan(cli, repo, cmap, "1%")
    chosen = [t["test"] for t in plan["selected"]]
    # test_all executed _impl_23 too, but it runs every implementation: the floor takes the
    # one test that ran it and little else
    assert chosen == ["tests/test_core.py::test_case_23"], chosen
    assert plan["coverage"]["floor"]["tests"] == chosen
    assert plan["coverage"]["floor"]["reached"] == ["pkg/core.py:_impl_23"]
    assert plan["coverage"]["floor"]["unknown"] == ["pkg/util.py:halve"]
    first = plan["selected"][0]
    assert "the coverage floor" in first["reasons"][0]
    assert (
        "changed pkg/core.py:_impl_23 (2 calls deep; ran the changed lines; runs 3 recorded functions)"
        in (first["reasons"][0])
    )
    note = next(n for n in plan["notes"] if n.startswith("coverage floor:"))
    assert "1 test(s) reach 1 of the 1 changed function(s) the map knows" in note
    assert "the map never saw pkg/util.py:halve" in note


def test_a_floor_beyond_the_budget_keeps_its_most_specific_part_and_says_so(
    base_map: tuple[Path, Path], tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, cmap = _recorded_copy(base_map, tmp_path)
    repo.commit("fix 5 and 23", {"pkg/core.py": _edit(5, 23)}, dedent=False)
    tight = _plan(cli, repo, cmap, "1")
    assert [t["test"] for t in tight["selected"]] == ["tests/test_core.py::test_case_05"]
    assert any("the coverage floor goes beyond the 1 tests budget" in n for n in tight["notes"])
    roomy = _plan(cli, repo, cmap, "3")
    chosen = [t["test"] for t in roomy["selected"]]
    assert chosen[:2] == ["tests/test_core.py::test_case_05", "tests/test_core.py::test_case_23"]
    assert not any("goes beyond" in n for n in roomy["notes"])


def test_a_map_off_the_change_line_makes_no_floor_and_says_why(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, _base = _upstream(tmp_path)
    repo.git("checkout", "-q", "-b", "side")
    side = repo.commit("side work", {"pkg/util.py": UTIL + "# side\n"}, dedent=False)
    cmap = tmp_path / "map.json.gz"
    _record(cli, repo, side, cmap)
    repo.git("checkout", "-q", "main")
    repo.commit("fix 23", {"pkg/core.py": _edit(23)}, dedent=False)
    plan = _plan(cli, repo, cmap, "1")
    assert plan["coverage"]["floor"]["tests"] == []
    assert "is not an ancestor of the change's base" in plan["coverage"]["floor"]["skipped"]
    assert any(
        n.startswith("coverage floor: none (the map's revision") and "ranking alone" in n
        for n in plan["notes"]
    )
    assert len(plan["selected"]) == 1  # the ranking still fills the budget


def test_the_floor_goes_ahead_of_higher_ranked_tests_and_picks_the_fewest_functions() -> None:
    cmap = CoverageMap("example/floor", "a" * 40)
    cmap.add("t.py::test_wide", {("m.py", "f"): 1, **{("m.py", f"g{i}"): 2 for i in range(9)}})
    cmap.add("t.py::test_narrow", {("m.py", "f"): 2, ("m.py", "h"): 1})
    cmap.add("t.py::test_other", {("m.py", "h"): 1})
    cmap.add("out.py::test_outside", {("m.py", "k"): 1})
    index = cmap.index()
    tests = [TestId("t.py", None, n) for n in ("test_wide", "test_narrow", "test_other")]
    floor = floor_for(
        index,
        {"m.py:f": [("m.py", "f")], "m.py:k": [("m.py", "k")]},
        ["m.py:f", "m.py:k", "m.py:new"],
        tests,
    )
    # test_narrow ran two functions (one call deeper); test_wide ran ten
    assert floor.tests == [TestId("t.py", None, "test_narrow")]
    assert (floor.reached, floor.unreached, floor.unknown) == (["m.py:f"], ["m.py:k"], ["m.py:new"])
    assert "no test in the universe executed m.py:k" in floor.note()
    scored = {t: Scored(t, [Evidence("candidates", "x", 0.9, "ranked high")]) for t in tests}
    scored[tests[1]] = Scored(tests[1], [Evidence("plan", FLOOR_SOURCE, 0.0, floor.why[tests[1]])])
    durations = dict.fromkeys(tests, 1.0)
    without, *_ = make_plan(scored, Budget("count", 1), durations, 1)
    assert [p.test for p in without] == [tests[2]]  # by rank alone it is outranked
    with_floor, _, _, notes = make_plan(scored, Budget("count", 1), durations, 1, floor=floor.tests)
    assert [p.test for p in with_floor] == [tests[1]] and notes == []
    assert with_floor[0].reasons[0] == floor.why[tests[1]]


def test_other_executing_tests_take_up_to_their_share_of_the_budget_most_specific_first() -> None:
    cmap = CoverageMap("example/floor", "a" * 40)
    # six tests ran f, each with more recorded functions than the one before; g is ranked
    for k in range(6):
        cmap.add(f"t.py::test_f{k}", {("m.py", "f"): 1, **{("m.py", f"x{i}"): 2 for i in range(k)}})
    cmap.add("t.py::test_g", {("m.py", "g"): 1})
    index = cmap.index()
    tests = [TestId("t.py", None, f"test_f{k}") for k in range(6)] + [
        TestId("t.py", None, "test_g")
    ]
    floor = floor_for(index, {"m.py:f": [("m.py", "f")]}, ["m.py:f"], tests)
    assert floor.tests == [tests[0]]
    assert floor.executed == tests[1:6]  # the rest of f's tests, fewest functions first
    assert "tests that executed a changed function go ahead" in floor.why[tests[3]]
    scored = {t: Scored(t, [Evidence("candidates", "x", 0.1, "ranked low")]) for t in tests}
    scored[tests[6]] = Scored(tests[6], [Evidence("candidates", "x", 0.9, "ranked high")])
    durations = dict.fromkeys(tests, 1.0)

    def chosen(budget: Budget, share: float) -> list[str]:
        selected, *_ = make_plan(
            scored, budget, durations, 1, floor=floor.tests, executed=floor.executed,
            executed_share=share,
        )  # fmt: skip
        return [p.test.name for p in selected]

    # 6 tests: the floor, then half the budget (3) to the executing tests, then the ranking
    assert chosen(Budget("count", 6), 0.5) == [
        "test_f0", "test_f1", "test_f2", "test_f3", "test_g", "test_f4",
    ]  # fmt: skip
    # no share: the floor alone, the ranking takes the rest (test_g first)
    assert chosen(Budget("count", 3), 0.0) == ["test_f0", "test_g", "test_f1"]
    # a seconds budget caps the share in seconds too
    assert chosen(Budget("seconds", 4.0), 0.5) == ["test_f0", "test_f1", "test_f2", "test_g"]


def test_the_plan_says_how_many_executing_tests_it_took_and_why_each(
    base_map: tuple[Path, Path], tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, cmap = _recorded_copy(base_map, tmp_path)
    repo.commit("fix 5 and 23", {"pkg/core.py": _edit(5, 23)}, dedent=False)
    plan = _plan(cli, repo, cmap, "10")
    chosen = [t["test"] for t in plan["selected"]]
    assert chosen[:3] == [
        "tests/test_core.py::test_case_05",
        "tests/test_core.py::test_case_23",
        "tests/test_core.py::test_all",  # ran both, and every other implementation
    ]
    assert plan["coverage"]["floor"]["executed"] == 1
    assert plan["coverage"]["floor"]["executed_taken"] == 1
    third = plan["selected"][2]
    assert "tests that executed a changed function go ahead of the ranking" in third["reasons"][0]
    note = next(n for n in plan["notes"] if n.startswith("coverage floor:"))
    assert "then 1 of the 1 other test(s) that executed a changed function" in note
    assert "up to 50% of the budget" in note


def test_an_executing_test_the_change_edits_is_not_counted_as_taken_for_having_executed(
    base_map: tuple[Path, Path], tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, cmap = _recorded_copy(base_map, tmp_path)
    edited = TESTS.replace(
        f"assert [dispatch(i) for i in range({N})]",
        f"assert len([dispatch(i) for i in range({N})]) == {N}",
    )
    repo.commit(
        "fix 5, and test_all with it",
        {"pkg/core.py": _edit(5), "tests/test_core.py": edited},
        dedent=False,
    )
    plan = _plan(cli, repo, cmap, "10")
    chosen = {t["test"]: t for t in plan["selected"]}
    assert "tests/test_core.py::test_all" in chosen  # the change edits it: it goes first
    assert plan["coverage"]["floor"]["executed"] == 1
    assert plan["coverage"]["floor"]["executed_taken"] == 0, chosen["tests/test_core.py::test_all"]
    reasons = chosen["tests/test_core.py::test_all"]["reasons"]
    assert not any("go ahead of the ranking" in r for r in reasons), reasons
