"""A coverage map in the backtest's choice (issue 34): replayed on the repository's own past
commits, the map is used only where it finds more edited tests than the ranking without it.
Real git histories built here, a map recorded by the real pytest plugin, and a map that
points at the wrong tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from test_selection.coverage.map import CoverageMap
from test_selection.ranking.allocation import REACHED_FILES, REACHED_FIRST
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget, TestPlan
from tests.conftest import CliResult
from tests.gitrepo import GitRepo
from tests.test_coverage_map import CORE, LARGE, OTHER, N, _record, _upstream, dispatcher

FIXES = 56  # past commits that each fix one implementation and its test: past one anchor


def _core(factors: dict[int, str]) -> str:
    text = dispatcher(N)
    for i, factor in factors.items():
        text = text.replace(f"    return n * {i + 2}\n", f"    return n * {factor}\n", 1)
    return text


def _large(notes: dict[int, int]) -> str:
    """The large test file; a fixed test keeps its length (only its message changes), so
    nothing but its execution says which one a change needs."""
    return "from pkg.core import dispatch\n\n" + "\n".join(
        f"def test_case_{i:02d}():\n    assert dispatch({i}) == {i} * {i + 2}, {notes.get(i, 0)}\n"
        for i in range(N)
    )


def _history(tmp_path: Path) -> tuple[GitRepo, str]:
    """A base (where the map is recorded), then FIXES commits that each change one
    implementation behind the dispatcher and edit the one test that reaches it, then a
    last change of implementation 23 alone. Returns the repository and the base."""
    repo = GitRepo(tmp_path / "up")
    repo.git("remote", "add", "origin", "https://github.com/example/dispatcher.git")
    factors: dict[int, str] = {}
    notes: dict[int, int] = {}
    base = repo.commit(
        "base",
        {
            "pkg/__init__.py": "",
            "pkg/core.py": _core(factors),
            "pkg/util.py": "def double(x):\n    return 2 * x\n",
            "tests/test_core.py": _large(notes),
            "tests/test_util.py": OTHER,
        },
        dedent=False,
    )
    for j in range(FIXES):
        i = (j * 7) % N
        factors[i] = f"({i + 2} + 0 * {j})"
        notes[i] = j + 1
        repo.commit(
            f"fix {i}",
            {"pkg/core.py": _core(factors), "tests/test_core.py": _large(notes)},
            dedent=False,
        )
    factors[23] = "(25 + 0 * 99)"
    repo.commit("fix 23", {"pkg/core.py": _core(factors)}, dedent=False)
    return repo, base


def _dispatch_map(base: str, shift: int = 0, own_test: bool = False) -> CoverageMap:
    """A map written by hand: implementation i executed by test i + ``shift`` (through the
    dispatcher), and with ``own_test`` each test executing its own function too, as the
    recorder sees it."""
    cmap = CoverageMap("example/dispatcher", base)
    for i in range(N):
        test = f"test_case_{(i + shift) % N:02d}"
        functions = {("pkg/core.py", "dispatch"): 1, ("pkg/core.py", f"_impl_{i}"): 2}
        if own_test:
            functions[("tests/test_core.py", test)] = 1
        cmap.add(f"tests/test_core.py::{test}", functions)
    return cmap


def _plan(repo: GitRepo, tmp_path: Path, cmap: CoverageMap | None) -> TestPlan:
    config = SelectorConfig(
        budget=Budget.parse("5%"),
        cache_dir=tmp_path / "cache",
        coverage=cmap.index() if cmap is not None else None,
    )
    plan, _change = select(repo.path, "HEAD~1", "HEAD", None, config)
    return plan


def test_the_backtest_uses_a_map_that_finds_the_edited_tests_of_past_commits(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, base = _history(tmp_path)
    map_file = tmp_path / "map.json.gz"
    recorded = _record(cli, repo, base, map_file)
    assert recorded.code == 0, recorded.output

    plain = _plan(repo, tmp_path, None)
    assert plain.ranking["backtest_commits"] >= 12, plain.ranking
    assert plain.ranking["coverage"] == ""
    assert "tests/test_core.py::test_case_23" not in [i.test.nodeid for i in plain.selected]

    plan = _plan(repo, tmp_path, CoverageMap.load(map_file))
    assert plan.ranking["coverage"] in (REACHED_FIRST, REACHED_FILES), plan.ranking
    figures = plan.ranking["candidates"]
    chosen = max(figures, key=lambda f: f["file_recall"] + f["edited_test_recall"])
    without = [f for f in figures if not f["coverage"]]
    # the edited test of each past fix is found through the map, and only through it
    assert chosen["coverage"] and chosen["edited_test_recall"] >= 0.9, figures
    assert max(f["edited_test_recall"] for f in without) <= 0.5, without
    assert "with the coverage map of" in plan.ranking["reason"]
    first = plan.selected[0]
    assert first.test.nodeid == "tests/test_core.py::test_case_23"
    said = [e.reason for e in first.evidence if e.source == "coverage"]
    assert said and "executed changed pkg/core.py:_impl_23" in said[0], first.evidence
    assert any(n.startswith("coverage map used (the backtest measured") for n in plan.notes)
    assert plan.coverage["used"] in (REACHED_FIRST, REACHED_FILES)


def test_a_map_that_points_at_the_wrong_tests_is_not_used_to_rank(tmp_path: Path) -> None:
    repo, base = _history(tmp_path)
    # each implementation "reached" by its neighbour's test: wrong on every past commit
    wrong = _dispatch_map(base, shift=1)
    plain = _plan(repo, tmp_path / "plain", None)
    plan = _plan(repo, tmp_path / "wrong", wrong)
    assert plan.ranking["coverage"] == "", plan.ranking
    # the ranking is the plain one; the coverage floor still takes the test the map says
    # executed the changed function (issue 55: the map is never left unused), ahead of it
    floor = plan.coverage["floor"]["tests"]
    assert floor == ["tests/test_core.py::test_case_24"], floor
    assert [i.test.nodeid for i in plan.selected] == floor + [
        i.test.nodeid for i in plain.selected if i.test.nodeid not in floor
    ][: len(plain.selected) - 1]
    assert plan.coverage["used"] == "unused"
    assert any(n.startswith("coverage map not used to rank") for n in plan.notes), plan.notes
    # the map's reach is still reported, but it moved nothing
    assert plan.coverage["known_functions"] == ["pkg/core.py:_impl_23"]
    assert all(e.source != "coverage" for i in plan.selected for e in i.evidence)


def test_functions_of_test_files_are_not_changed_functions_to_the_map(tmp_path: Path) -> None:
    repo, base = _upstream(tmp_path)
    cmap = _dispatch_map(base, own_test=True)
    # the change fixes implementation 23 and edits test 5: only the first is the map's to say
    repo.commit(
        "fix 23, reword 5",
        {
            "pkg/core.py": CORE.replace("n * 25\n", "n * 25 + 0\n"),
            "tests/test_core.py": LARGE.replace("dispatch(5) == 5 * 7", "dispatch(5) == 35"),
        },
        dedent=False,
    )
    plan = _plan(repo, tmp_path, cmap)
    assert plan.coverage["changed_functions"] == 1, plan.coverage
    assert plan.coverage["known_functions"] == ["pkg/core.py:_impl_23"]
    assert plan.coverage["tests_reached"] == 1
    # the edited test runs for its edit, the fixed implementation's test through the map
    chosen = {i.test.nodeid: i for i in plan.selected}
    assert set(chosen) == {"tests/test_core.py::test_case_05", "tests/test_core.py::test_case_23"}
    assert [e.source for e in chosen["tests/test_core.py::test_case_05"].evidence].count(
        "coverage"
    ) == 0
