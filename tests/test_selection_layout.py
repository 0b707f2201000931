"""Any layout: tests/, test/, *_test.py and pytest's own configuration, without flags."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from test_selection.git import Repo
from test_selection.layout import DEFAULT_PATTERNS, detect_layout, patterns_from_pytest
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget
from tests.conftest import CliResult
from tests.gitrepo import GitRepo

SOURCE = "def scale(x):\n    return x * {n}\n"
TEST = """
from pkg.ops import scale


def test_scale():
    assert scale(1) == {n}


def test_other():
    assert True
"""


def _repo(tmp_path: Path, test_path: str, extra: dict[str, str] | None = None) -> GitRepo:
    repo = GitRepo(tmp_path / "up")
    repo.commit(
        "base",
        {"pkg/__init__.py": "", "pkg/ops.py": SOURCE.format(n=2), test_path: TEST.format(n=2)}
        | (extra or {}),
    )
    repo.commit("change scale", {"pkg/ops.py": SOURCE.format(n=3)})
    return repo


@pytest.mark.parametrize(
    "test_path",
    [
        "tests/test_ops.py",
        "tests/unit/test_ops.py",
        "test/test_ops.py",
        "pkg/ops_test.py",
        "pkg/sub/tests/test_ops.py",  # beside the code (networkx, dask)
    ],
)
def test_common_layouts_work_without_flags(tmp_path: Path, test_path: str) -> None:
    repo = _repo(tmp_path, test_path)
    plan, _ = select(repo.path, "HEAD~1", "HEAD", config=SelectorConfig(budget=Budget("all")))
    assert plan.universe_size == 2
    assert {p.test.file for p in plan.selected} == {test_path}
    assert plan.patterns == list(DEFAULT_PATTERNS)
    data = plan.to_json()
    assert set(data["timings"]) == {
        "change_analysis",
        "inventory",
        "history",
        "backtest",
        "ranking",
        "candidates",
        "agent",
        "plan",
    }
    assert data["shares"]["tests"] == 1.0 and data["shares"]["test_files"] == 1.0


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("pytest.ini", "[pytest]\ntestpaths = checks\npython_files = check_*.py\n"),
        (
            "pyproject.toml",
            '[tool.pytest.ini_options]\ntestpaths = ["checks"]\npython_files = ["check_*.py"]\n',
        ),
        ("setup.cfg", "[tool:pytest]\ntestpaths = checks\npython_files = check_*.py\n"),
        ("tox.ini", "[pytest]\ntestpaths =\n    checks\npython_files = check_*.py\n"),
    ],
)
def test_pytest_configuration_names_the_layout(tmp_path: Path, name: str, config: str) -> None:
    repo = _repo(tmp_path, "checks/check_ops.py", {name: config})
    layout = detect_layout(Repo(repo.path), "HEAD")
    assert layout.patterns == ("checks/check_*.py", "checks/**/check_*.py")
    assert layout.source.startswith(name)
    plan, _ = select(repo.path, "HEAD~1", "HEAD", config=SelectorConfig(budget=Budget("all")))
    assert {p.test.file for p in plan.selected} == {"checks/check_ops.py"}


def test_python_files_alone_keep_pytests_default_places() -> None:
    assert patterns_from_pytest({"python_files": "check_*.py"}) == ("*check_*.py",)
    assert patterns_from_pytest({"addopts": "-ra"}) is None


def test_an_empty_universe_is_an_error_with_the_patterns_tried(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo = _repo(tmp_path, "src/checks_ops.py")
    result = cli("select", "--upstream", repo.path, "--base", "HEAD~1", "--head", "HEAD")
    assert result.code == 2, result.output
    assert "no test file at" in result.stderr and "*/test_*.py" in result.stderr
    assert "--pattern" in result.stderr
    # with the layout named, it selects
    named = cli(
        "select",
        "--upstream",
        repo.path,
        "--base",
        "HEAD~1",
        "--head",
        "HEAD",
        "--pattern",
        "src/checks_*.py",
        "--json",
    )
    assert named.code == 0, named.output
    assert json.loads(named.stdout)["patterns"] == ["src/checks_*.py"]


def test_tests_outside_testpaths_count_unless_inside_a_package(tmp_path: Path) -> None:
    """``testpaths`` says where a bare pytest starts; benchmarks/ holds tests too, while a
    test_*.py inside the package is a helper module (PyTorch's torch/_dynamo/test_case.py)."""
    repo = _repo(
        tmp_path,
        "tests/test_ops.py",
        {
            "pytest.ini": "[pytest]\ntestpaths = tests\n",
            "benchmarks/test_speed.py": "def test_speed():\n    assert True\n",
            "pkg/test_case.py": "class TestCase:\n    pass\n",
            ".github/scripts/test_ci.py": "def test_ci():\n    pass\n",
        },
    )
    layout = detect_layout(Repo(repo.path), "HEAD")
    assert "benchmarks (not packages)" in layout.source
    plan, _ = select(repo.path, "HEAD~1", "HEAD", config=SelectorConfig(budget=Budget("all")))
    files = {p.test.file for p in plan.selected}
    assert files == {"tests/test_ops.py", "benchmarks/test_speed.py"}


def test_what_pytest_walks_into_and_what_addopts_deselects() -> None:
    from test_selection.layout import not_recursed, recursed, selecting_addopts

    assert recursed("tests/test_x.py", not_recursed({}))
    assert not recursed("build/lib/test_x.py", not_recursed({}))  # pytest's own default
    assert not recursed(".tox/py/test_x.py", not_recursed({}))
    own = not_recursed({"norecursedirs": "typecheck tests/data"})
    assert not recursed("tests/typecheck/test_cases.py", own)
    assert not recursed("tests/data/test_sample.py", own)
    assert recursed("other/data/test_sample.py", own) and recursed("build/test_x.py", own)
    addopts = "-ra -x -m 'not stress' --ignore tests/big --deselect=a.py::t -kquick -n 4"
    assert selecting_addopts({"addopts": addopts}) == [
        "-m", "not stress", "--ignore=tests/big", "--deselect=a.py::t", "-k", "quick",
    ]  # fmt: skip
    assert selecting_addopts({}) == [] and selecting_addopts({"addopts": "-m"}) == []
