"""Line-level coverage maps (issue 55, item 3): the recorder keeps the lines each test ran
(coverage.py's tracer, one context per test), the map stores them as ranges, and a change
confined to a few statements of a function's body puts the tests that ran those statements
first in the floor; a header change counts as the whole function, and a file that moved
since the map was recorded is read at function level. Real recordings of real git
repositories built here, through the command line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from test_selection.change_analysis import _defs, body_lines
from test_selection.coverage.map import (
    MAX_DEPTH,
    CoverageMap,
    CoverageMapError,
    parse_ranges,
    ranges,
)
from test_selection.coverage.recorder import FunctionSpans
from test_selection.coverage.update import Update, merged
from tests.conftest import CliResult
from tests.gitrepo import GitRepo

CORE = """\
def helper(n):
    return n


def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x
"""
EXTRA = "".join(f"def step_{i}():\n    return {i}\n\n\n" for i in range(6))
# six tests run clamp's last line only, and little else (the most specific); one runs the
# `return high` branch and many other functions (the least specific)
TESTS = (
    "from pkg import extra\nfrom pkg.core import clamp, helper\n\n\n"
    + "".join(f"def test_inside_{i}():\n    assert clamp({i}, 0, 5) == {i}\n\n\n" for i in range(6))
    + "def test_above():\n"
    + "".join(f"    extra.step_{i}()\n" for i in range(6))
    + "    assert clamp(helper(10), 0, 5) == 5\n"
)
ABOVE = "tests/test_core.py::test_above"


def _upstream(tmp_path: Path) -> tuple[GitRepo, str]:
    repo = GitRepo(tmp_path / "up")
    repo.git("remote", "add", "origin", "https://github.com/example/lines.git")
    base = repo.commit(
        "base",
        {
            "pkg/__init__.py": "",
            "pkg/core.py": CORE,
            "pkg/extra.py": EXTRA,
            "tests/test_core.py": TESTS,
        },
        dedent=False,
    )
    return repo, base


def _record(
    cli: Callable[..., CliResult], repo: GitRepo, rev: str, out: Path, *extra: str, **env: str
) -> CliResult:
    done = cli("coverage", "record", "--upstream", repo.path, "--rev", rev, "-o", out, *extra,
               env=env or None)  # fmt: skip
    assert done.code == 0, done.output
    return done


def _plan(cli: Callable[..., CliResult], repo: GitRepo, cmap: Path) -> Any:
    done = cli(
        "select", "--upstream", repo.path, "--base", "HEAD~1", "--head", "HEAD",
        "--budget", "1", "--agent", "none", "--json", "--coverage", cmap,
    )  # fmt: skip
    assert done.code == 0, done.output
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """One upstream, recorded at its base with lines and without (each recording costs
    seconds: the module's tests copy the checkout and share the maps)."""
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("lines")
    repo, base = _upstream(root)
    maps = []
    for name, extra in (("lines", []), ("functions", ["--no-lines"])):
        out = root / f"{name}.json.gz"
        proc = subprocess.run(
            [sys.executable, "-m", "ci_relay", "coverage", "record", "--upstream", str(repo.path),
             "--rev", base, "-o", str(out), *extra],
            capture_output=True, text=True, check=False, cwd=root, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        maps.append(out)
    return repo.path, maps[0], maps[1]


def _copy(recorded: tuple[Path, Path, Path], tmp_path: Path) -> GitRepo:
    import shutil

    shutil.copytree(recorded[0], tmp_path / "up")
    return GitRepo(tmp_path / "up")  # re-initialising an existing repository keeps it


def test_the_recorder_keeps_the_lines_each_test_ran_in_the_code(
    recorded: tuple[Path, Path, Path], cli: Callable[..., CliResult]
) -> None:
    shown = json.loads(cli("coverage", "show", recorded[1], "--json").stdout)
    assert shown["tests_with_lines"] == 7 and shown["lines_missing"] == ""
    cmap = CoverageMap.load(recorded[1])
    return_high = CORE.splitlines().index("        return high") + 1
    return_x = CORE.splitlines().index("    return x") + 1
    assert return_high in cmap.lines[ABOVE]["pkg/core.py"]
    inside = cmap.lines["tests/test_core.py::test_inside_3"]["pkg/core.py"]
    assert return_x in inside and return_high not in inside
    # only the code's files: not the tests' own file
    assert all(not f.startswith("tests/") for lines in cmap.lines.values() for f in lines)
    assert CoverageMap.load(recorded[2]).lines == {}


def test_a_change_to_one_branch_puts_the_test_that_ran_it_first(
    recorded: tuple[Path, Path, Path], tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo = _copy(recorded, tmp_path)
    repo.commit(
        "clamp: the upper bound",
        {"pkg/core.py": CORE.replace("        return high", "        return min(high, x)")},
        dedent=False,
    )
    with_lines = _plan(cli, repo, recorded[1])
    assert [t["test"] for t in with_lines["selected"]] == [ABOVE]
    assert "ran the changed lines" in with_lines["selected"][0]["reasons"][0]
    assert with_lines["coverage"]["line_level"] == ["pkg/core.py:clamp"]
    # the same change with a map of functions only: the most specific test, which never
    # took that branch
    without = _plan(cli, repo, recorded[2])
    chosen = [t["test"] for t in without["selected"]]
    assert chosen != [ABOVE] and chosen[0].startswith("tests/test_core.py::test_inside_")
    assert without["coverage"]["line_level"] == []


def test_a_change_to_a_functions_header_counts_as_the_whole_function(
    recorded: tuple[Path, Path, Path], tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo = _copy(recorded, tmp_path)
    repo.commit(
        "clamp: a default",
        {"pkg/core.py": CORE.replace("def clamp(x, low, high):", "def clamp(x, low, high=9):")},
        dedent=False,
    )
    plan = _plan(cli, repo, recorded[1])
    assert plan["selected"][0]["test"].startswith("tests/test_core.py::test_inside_")
    assert plan["coverage"]["line_level"] == []


def test_a_file_changed_since_the_map_is_read_at_function_level(
    recorded: tuple[Path, Path, Path], tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo = _copy(recorded, tmp_path)
    moved = "# a comment that moves every line down\n" + CORE
    repo.commit("a comment", {"pkg/core.py": moved}, dedent=False)
    repo.commit(
        "clamp: the upper bound",
        {"pkg/core.py": moved.replace("        return high", "        return min(high, x)")},
        dedent=False,
    )
    plan = _plan(cli, repo, recorded[1])
    assert plan["coverage"]["line_level"] == []
    assert plan["selected"][0]["test"] != ABOVE


def test_without_coverage_py_the_map_says_it_holds_no_lines(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, base = _upstream(tmp_path)
    fake = tmp_path / "fake" / "coverage"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('coverage.py is not here')\n")
    out = tmp_path / "map.json.gz"
    done = _record(cli, repo, base, out, PYTHONPATH=str(fake.parent))
    assert "no lines: coverage.py is not installed in the recording Python" in done.stdout
    shown = cli("coverage", "show", out)
    assert "lines executed: not recorded: coverage.py is not installed" in shown.stdout
    cmap = CoverageMap.load(out)
    assert cmap.lines == {} and len(cmap.tests) == 7
    assert "coverage.py is not installed" in cmap.lines_missing


def test_changed_statements_are_named_by_their_first_line() -> None:
    source = b'def f(x):\n    """doc"""\n    y = g(\n        x,\n        2)\n    if y:\n        return 1\n    return 2\n'
    span = _defs(source, "a.py")[0]["f"]
    assert body_lines(span, [(4, 1, 4, 1)]) == frozenset({3})  # inside a call spread over lines
    assert body_lines(span, [(7, 1, 7, 1)]) == frozenset({7})
    assert body_lines(span, [(6, 0, 7, 1)]) == frozenset({6, 7})  # an insertion: both neighbours
    assert body_lines(span, [(8, 0, 9, 1)]) is None  # added after the last statement
    assert body_lines(span, [(1, 1, 1, 1)]) is None  # the signature
    assert body_lines(span, [(2, 1, 2, 1)]) is None  # the docstring


def test_line_ranges_round_trip_and_a_damaged_one_is_refused() -> None:
    assert ranges([9, 1, 2, 3, 7, 10]) == "1-3,7,9-10"
    assert parse_ranges("1-3,7,9-10") == {1, 2, 3, 7, 9, 10}
    # line 0 (code compiled without positions) is no line: left out, so the map still reads
    assert ranges([0, 1, 2, 5]) == "1-2,5"
    assert parse_ranges(ranges([0, -1])) == frozenset()
    with pytest.raises(ValueError, match="bad line range '0'"):
        parse_ranges("0")
    cmap = CoverageMap("o/n", "a" * 40)
    cmap.add("t.py::test", {("m.py", "f"): 1}, (), {"m.py": [3, 4, 5]})
    back = CoverageMap.from_json(json.loads(json.dumps(cmap.to_json())))
    assert back.lines == {"t.py::test": {"m.py": frozenset({3, 4, 5})}}
    damaged = cmap.to_json()
    damaged["lines"]["sets"][0][0][1] = "5-3"
    with pytest.raises(CoverageMapError, match="damaged"):
        CoverageMap.from_json(damaged)


def test_a_map_brought_forward_keeps_lines_only_where_they_cannot_have_moved() -> None:
    old = CoverageMap("o/n", "a" * 40)
    old.add("t.py::test_a", {("a.py", "f"): 1}, (), {"a.py": [3]})
    old.add("t.py::test_b", {("b.py", "g"): 1}, (), {"b.py": [7], "c.py": [2]})
    fresh = CoverageMap("o/n", "b" * 40)
    update = Update([], {t: dict(f) for t, f in old.tests.items()}, "", frozenset({"c.py"}))
    out = merged(fresh, update, old)
    assert out.lines == {"t.py::test_a": {"a.py": frozenset({3})}}
    assert out.index().lines_of("t.py::test_b", "b.py") is None  # not known, not "none"
    assert out.index().lines_of("t.py::test_a", "b.py") == frozenset()


THREADED = """\
import threading


def served(x):
    return handle(x) + 1


def handle(x):
    return x * 2


class App:
    def call(self, x):
        def inner(y):
            return y - 1

        return inner(x)
"""
THREAD_TESTS = """\
import threading

from pkg.app import App, served


def test_in_a_thread():
    out = []
    worker = threading.Thread(target=lambda: out.append(served(3)))
    worker.start()
    worker.join()
    assert out == [7]


def test_direct():
    assert App().call(2) == 1
"""


def test_what_a_test_runs_in_a_thread_is_recorded_from_its_lines(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """The profiler follows only the test's own thread (a web framework's test client runs
    the app in another): the functions the thread ran come from the lines coverage.py traced
    there, at the farthest distance; a test the profiler followed gets none that way."""
    repo = GitRepo(tmp_path / "up")
    base = repo.commit(
        "base", {"pkg/__init__.py": "", "pkg/app.py": THREADED, "tests/test_app.py": THREAD_TESTS},
        dedent=False,
    )  # fmt: skip
    out = tmp_path / "map.json.gz"
    _record(cli, repo, base, out)
    cmap = CoverageMap.load(out)
    threaded = cmap.tests["tests/test_app.py::test_in_a_thread"]
    assert "threads" in cmap.flags["tests/test_app.py::test_in_a_thread"]
    assert threaded[("pkg/app.py", "served")] == MAX_DEPTH
    assert threaded[("pkg/app.py", "handle")] == MAX_DEPTH
    direct = cmap.tests["tests/test_app.py::test_direct"]
    assert direct[("pkg/app.py", "App.call")] == 1  # the profiler's own distance
    assert ("pkg/app.py", "App.call.<locals>.inner") in direct
    # without lines there is nothing to read the thread's work from
    _record(cli, repo, base, out, "--no-lines")
    assert ("pkg/app.py", "served") not in CoverageMap.load(out).tests[
        "tests/test_app.py::test_in_a_thread"
    ]


def test_lines_are_named_as_the_profiler_names_functions(tmp_path: Path) -> None:
    source = tmp_path / "app.py"
    source.write_text(THREADED + "\nif True:\n    def later():\n        return 0\n")
    numbered = {n: line for n, line in enumerate(source.read_text().splitlines(), 1)}
    where = {text.strip(): n for n, text in numbered.items()}
    lines = {"app.py": {where["return handle(x) + 1"], where["return y - 1"],
                        where["return inner(x)"], where["def inner(y):"],
                        where["return 0"], where["import threading"]}}  # fmt: skip
    found = FunctionSpans().functions(lines, {"app.py": str(source)})
    assert set(found) == {
        ("app.py", "served"),
        ("app.py", "App.call.<locals>.inner"),
        ("app.py", "App.call"),  # the inner def's header runs in App.call
        ("app.py", "later"),
    }
    assert FunctionSpans().functions({"gone.py": {1}}, {"gone.py": str(tmp_path / "no")}) == {}
