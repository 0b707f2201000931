"""Recording with ``sys.monitoring`` (Python 3.12+, issue 55's recording cost): each
function's first start in a test, at the distance of that first call, in every thread. Real
recordings through the command line, with a Python 3.12+ environment made here (skipped,
saying why, on a machine that has none)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from test_selection.coverage.map import CoverageMap
from tests.conftest import CliResult
from tests.gitrepo import GitRepo
from tests.test_coverage_lines import THREAD_TESTS, THREADED

THREAD = "tests/test_app.py::test_in_a_thread"
# a test that profiles on its own: the recorder's tool id is not the profiler's
OWN = (
    "import cProfile\n\nfrom pkg.app import served\n\n\ndef test_profiles():\n"
    "    p = cProfile.Profile()\n    p.enable()\n    served(1)\n    p.disable()\n"
)
DIRECT = "tests/test_app.py::test_direct"


def _newer_python() -> str | None:
    pyenv = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    found = [shutil.which("python3.13"), shutil.which("python3.12"),
             *sorted(glob.glob(f"{pyenv}/versions/3.1[2-9]*/bin/python3"))]  # fmt: skip
    for python in filter(None, found):
        probe = subprocess.run([python, "-c", "import sys; sys.monitoring"],
                               capture_output=True, check=False)  # fmt: skip
        if probe.returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def python312(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv of Python 3.12+ with pytest and coverage.py (from the package registry)."""
    python = _newer_python()
    if python is None:
        pytest.skip("no Python 3.12+ on this machine: sys.monitoring cannot be tried")
    venv = tmp_path_factory.mktemp("py312") / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True)
    made = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                           "pytest", "coverage"], capture_output=True, text=True, check=False)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"pytest could not be installed for {python}: {made.stderr[-300:]}")
    return str(venv / "bin" / "python")


def _record(
    cli: Callable[..., CliResult], tmp_path: Path, python: str, *extra: str, lines: bool = False
) -> CliResult:
    repo = GitRepo(tmp_path / "up")
    if not (tmp_path / "up" / "pkg").is_dir():
        repo.commit("base", {"pkg/__init__.py": "", "pkg/app.py": THREADED,
                             "tests/test_app.py": THREAD_TESTS, "tests/test_own.py": OWN},
                    dedent=False)  # fmt: skip
    return cli("coverage", "record", "--upstream", repo.path, "-o", tmp_path / "map.json.gz",
               "--python", python, "--lines" if lines else "--no-lines", *extra)  # fmt: skip


def test_monitoring_records_every_thread_at_the_first_call_s_distance(
    tmp_path: Path, cli: Callable[..., CliResult], python312: str
) -> None:
    done = _record(cli, tmp_path, python312)
    assert done.code == 0 and "3 passed" in done.output, done.output
    tests = CoverageMap.load(tmp_path / "map.json.gz").tests
    assert tests["tests/test_own.py::test_profiles"][("pkg/app.py", "served")] == 1
    # the thread's work is seen without lines: the test file's lambda started it (1 call)
    assert tests[THREAD][("pkg/app.py", "served")] == 1
    assert tests[THREAD][("pkg/app.py", "handle")] == 2
    monitored = tests[DIRECT]
    # cProfile, asked for, sees the same functions, at the same distances
    done = _record(cli, tmp_path, python312, "--", "--coverage-profiler", "cprofile")
    assert done.code == 0, done.output
    profiled = CoverageMap.load(tmp_path / "map.json.gz").tests
    assert profiled[DIRECT] == monitored
    assert ("pkg/app.py", "App.call.<locals>.inner") in monitored
    assert ("pkg/app.py", "served") in profiled[THREAD]  # from 3.12 on cProfile sees threads


def test_monitoring_asked_for_where_there_is_none_is_refused(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    if sys.version_info >= (3, 12):
        pytest.skip("this Python has sys.monitoring")
    refused = _record(cli, tmp_path, sys.executable, "--", "--coverage-profiler", "monitoring")
    assert refused.code == 1 and "pytest exit 4" in refused.output, refused.output
    assert "--coverage-profiler monitoring: needs Python 3.12+" in refused.output
    assert "wrote no map" in refused.output
    assert not (tmp_path / "map.json.gz").exists()


def test_monitoring_keeps_the_lines_coverage_py_would(
    tmp_path: Path, cli: Callable[..., CliResult], python312: str
) -> None:
    """Each line's first run per test, then silence: the same lines coverage.py's tracer
    records (it is asked for with cProfile), test files left out, without coverage.py."""
    done = _record(cli, tmp_path, python312, lines=True)
    assert done.code == 0, done.output
    monitored = CoverageMap.load(tmp_path / "map.json.gz").lines
    done = _record(cli, tmp_path, python312, "--", "--coverage-profiler", "cprofile", lines=True)
    assert done.code == 0, done.output
    traced = CoverageMap.load(tmp_path / "map.json.gz").lines
    # (the test that starts its own cProfile cannot under cProfile: it fails before its call)
    assert {t: monitored[t] for t in (DIRECT, THREAD)} == {t: traced[t] for t in (DIRECT, THREAD)}
    assert set(monitored[DIRECT]) == {"pkg/app.py"}  # not tests/test_app.py
    assert len(monitored[DIRECT]["pkg/app.py"]) == 3


# code compiled from a syntax tree without positions, run as the module's own file: its
# lines are reported as line 0 (astroid's tests do this; maps with it could not be read)
GENERATED = (
    "import ast\n\n\ndef run():\n"
    "    node = ast.Assign([ast.Name('x', ast.Store(), lineno=0, col_offset=0)],\n"
    "                      ast.Constant(1, lineno=0, col_offset=0), lineno=0, col_offset=0)\n"
    "    space = {}\n"
    "    exec(compile(ast.Module([node], []), __file__, 'exec'), space)\n"
    "    return space['x']\n"
)


def test_a_line_zero_is_no_line_and_the_map_still_reads(
    tmp_path: Path, cli: Callable[..., CliResult], python312: str
) -> None:
    repo = GitRepo(tmp_path / "up")
    repo.commit("base", {"pkg/__init__.py": "", "pkg/gen.py": GENERATED,
                         "tests/test_gen.py": "from pkg.gen import run\n\n\n"
                                              "def test_run():\n    assert run() == 1\n"},
                dedent=False)  # fmt: skip
    done = cli("coverage", "record", "--upstream", repo.path, "-o", tmp_path / "map.json.gz",
               "--python", python312, "--lines")  # fmt: skip
    assert done.code == 0 and "1 passed" in done.output, done.output
    lines = CoverageMap.load(tmp_path / "map.json.gz").lines["tests/test_gen.py::test_run"]
    assert 0 not in lines["pkg/gen.py"] and {5, 8, 9} <= set(lines["pkg/gen.py"]), lines
