"""``bench/bench_mutation.py`` (issue 35) on the sample upstream: two mutants of functions the
sample's tests run against (the installed torch's, broken in the test process by the bench's
plugin), one caught and one equivalent; the truth from real pytest runs, the same mutation
committed to the sample's own copy of the file, and the figures checked against the plan
``ci-relay select --json`` makes for that commit."""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ci_relay.sample_upstream import SampleUpstream
from tests.conftest import CliResult

BENCH = Path(__file__).resolve().parents[1] / "bench"
CAUGHT = "torch/nn/functional.py::relu"
EQUIVALENT = "torch/_refs/__init__.py::unsqueeze"
RELU_TEST = "test/test_nn_functional.py::TestNNFunctional::test_relu_inplace"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load("bench_mutation")


def test_each_operator_changes_the_function_and_only_it(bench: ModuleType) -> None:
    ml = sys.modules["mutation_lib"]
    text = (
        "import math\n\n"
        "def other(a):\n    return a\n\n"
        "def f(a, b, n=2):\n"
        '    """Doc."""\n'
        "    if a < b:  # keep this comment\n"
        "        return round(math.pow(a, b), ndigits=n)\n"
        "    return a - 3\n"
    )
    namespace: dict[str, object] = {}
    exec(compile(text, "orig", "exec"), namespace)
    original = namespace["f"]
    assert callable(original)
    for operator in ml.OPERATORS:
        mutated, what = ml.mutate_text(text, "f", operator, random.Random(0))
        assert mutated != text and what
        # the rest of the file is byte for byte the same
        assert mutated.startswith("import math\n\ndef other(a):\n    return a\n")
        assert ast.dump(ast.parse(mutated).body[1]) == ast.dump(ast.parse(text).body[1])
        assert "# keep this comment" in mutated
        source, line = ml.function_source(mutated, "f")
        assert source.startswith("def f(a, b, n=2):") and line == 6
        space: dict[str, object] = {"__mutation_perturb__": lambda v: v + 1}
        exec(compile(mutated, "mutant", "exec"), space)
        mutant = space["f"]
        assert callable(mutant)
        results = []
        for args in ((1.5, 2.0), (2.0, 1.5), (3, 2), (2, 7), (2, 2)):
            try:
                results.append(mutant(*args) != original(*args))
            except (RuntimeError, TypeError):
                results.append(True)
        assert any(results), operator
    with pytest.raises(ValueError, match="nothing to change"):
        ml.mutate_text(text, "other", "swap-args", random.Random(0))
    with pytest.raises(ValueError, match="unknown operator"):
        ml.mutate_text(text, "f", "delete", random.Random(0))


def test_a_caught_and_an_equivalent_mutant_on_the_sample_upstream(
    bench: ModuleType,
    sample_upstream: SampleUpstream,
    cli: Callable[..., CliResult],
    tmp_path: Path,
) -> None:
    repo = sample_upstream.path
    opts = bench.parse(
        [
            str(repo), "--installed", "torch", "--count", "2", "--timeout", "120",
            "--target", f"{CAUGHT}::raise", "--target", f"{EQUIVALENT}::raise",
            "--tests", "test/test_nn_functional.py",
            "--preload", "torch.testing._internal.common_utils",
        ]
    )  # fmt: skip
    opts.cache_dir = tmp_path / "cache"
    opts.json = tmp_path / "record.json"
    record = bench.run(opts, log=lambda line: None)
    rows = {r["target"]["file"] + "::" + r["target"]["qualname"]: r for r in record["rows"]}
    assert record["baseline"] == {"tests": 5, "passed": 5}
    # run again on the saved record: each mutant's truth is taken back, not run again, and
    # the selections are made anew (the same here)
    said: list[str] = []
    again = bench.run(opts, log=said.append)
    assert sum("(saved truth)" in line for line in said) == 2, said

    def kept(rows: list[dict[str, Any]]) -> list[Any]:
        return [
            (
                r["ident"],
                r["status"],
                r["failing"],
                {k: v["found"] for k, v in r["results"].items()},
            )
            for r in rows
        ]

    assert kept(again["rows"]) == kept(record["rows"])

    # the truth: raising in relu fails the one test that calls F.relu; unsqueeze of _refs
    # is never called by these tests (torch.unsqueeze is not the Python reference)
    caught, equivalent = rows[CAUGHT], rows[EQUIVALENT]
    assert caught["status"] == "killed" and caught["failing"] == [RELU_TEST]
    assert caught["applied"] >= 1 and not caught["timed_out"]
    assert equivalent["status"] == "equivalent" and equivalent["failing"] == []
    assert equivalent["applied"] >= 1 and "head" not in equivalent and not equivalent["results"]

    # the same mutation as a commit: the sample's own relu, one line added, nothing else
    head = caught["head"]
    assert subprocess.run(
        ["git", "-C", str(repo), "diff", "--name-only", record["base"], head],
        capture_output=True, text=True, check=True,
    ).stdout.split() == ["torch/nn/functional.py"]  # fmt: skip
    diff = subprocess.run(
        ["git", "-C", str(repo), "diff", "-U0", record["base"], head],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    added = [line for line in diff.splitlines() if line.startswith("+") and "+++" not in line]
    assert added == ["+    raise RuntimeError('mutant: relu raises')"]
    assert "@@ def relu(" in diff

    # the figures: only the caught mutant counts, and each budget's plan is the one the
    # command line makes for the commit
    figures = bench.figures(record)
    assert set(figures) == {"selector@0.05", "selector@0.15"}
    for key, figure in figures.items():
        budget = key.rsplit("@", 1)[1]
        result = cli(
            "select", "--upstream", repo, "--base", record["base"], "--head", head,
            "--budget", f"{round(float(budget) * 100)}%", "--agent", "none", "--json",
        )  # fmt: skip
        assert result.code == 0, result.output
        plan = json.loads(result.stdout)
        chosen = {item["test"].split("[", 1)[0] for item in plan["selected"]}
        in_plan = RELU_TEST in chosen
        assert figure["mutants"] == 1
        assert figure["caught"] == (1.0 if in_plan else 0.0)
        assert figure["recall"] == (1.0 if in_plan else 0.0)
        assert figure["tests"] == len(plan["selected"])
        assert figure["share"] == pytest.approx(len(plan["selected"]) / plan["universe_size"])
        misses = caught["results"][key]["misses"]
        assert (misses == {}) is in_plan

    lines: list[str] = []
    bench.print_report(record, out=lines.append)
    report = "\n".join(lines)
    assert "2 mutants: 1 fail tests, 1 fail nothing" in report
    assert f"equivalent: {EQUIVALENT}:raise:0" in report


def _package(tmp_path: Path, core: str) -> Path:
    """A checkout holding the package ``pkg`` whose ``core.py`` is ``core``."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "core.py").write_text(core)
    return repo


def test_the_runner_counts_a_hang_and_a_crash_as_failing_and_goes_on(
    bench: ModuleType, tmp_path: Path
) -> None:
    ml = sys.modules["mutation_lib"]
    code = "import os\nimport time\n\n\ndef step(x):\n    return x + 1\n"
    repo = _package(tmp_path, code)
    (repo / "test_core.py").write_text(
        "from pkg.core import step\n\n"
        "def test_a():\n    assert step(1) == 2\n\n"
        "def test_b():\n    assert step(2) == 3\n\n"
        "def test_c():\n    assert step(5) == 6\n\n"
        "def test_d():\n    assert step(0) == 1\n"
    )
    target = ml.Target("pkg/core.py", "step", "pkg.core")
    # a mutant that hangs on one input and kills the process on another
    broken = code.replace(
        "    return x + 1\n",
        "    if x == 2:\n        time.sleep(600)\n    if x == 5:\n        os._exit(9)\n"
        "    return x + 1\n",
    )
    source, _ = ml.function_source(broken, "step")
    mutant = ml.Mutant(target, "test", "hang and crash", source, str(repo / "pkg/core.py"), broken)
    for preload in ([], ["pkg.core"]):
        runner = ml.Runner(sys.executable, [str(repo)], preload)
        try:
            args = [str(repo / "test_core.py"), f"--rootdir={repo}"]
            baseline = runner.run(tmp_path, repo, args, timeout=60)
            result = runner.run(tmp_path, repo, args, timeout=60, mutant=mutant, test_timeout=3)
        finally:
            runner.close()
        assert baseline.passed() == {f"test_core.py::test_{n}" for n in "abcd"}
        assert result.applied == 1 and not result.timed_out and result.restarts == 2
        assert result.outcomes == {
            "test_core.py::test_a": "passed",
            "test_core.py::test_b": "crashed",
            "test_core.py::test_c": "crashed",
            "test_core.py::test_d": "passed",
        }
        assert ml.failing_tests(baseline, result) == {
            "test_core.py::test_b",
            "test_core.py::test_c",
        }


def test_a_mutant_that_breaks_a_test_module_at_import_fails_its_tests(
    bench: ModuleType, tmp_path: Path
) -> None:
    """A mutant run while a test module is imported stops its collection: pytest exits 2, and
    the module's tests (passed unmutated) are the truth, not an error of the run; ``only``
    runs just the tests named."""
    ml = sys.modules["mutation_lib"]
    code = "def table():\n    return {'a': 1}\n\n\ndef step(x):\n    return x + 1\n"
    repo = _package(tmp_path, code)
    (repo / "test_table.py").write_text(
        "from pkg.core import table\n\nTABLE = table()\n\n"
        "def test_t():\n    assert TABLE['a'] == 1\n"
    )
    (repo / "test_step.py").write_text(
        "from pkg.core import step\n\n"
        "def test_a():\n    assert step(1) == 2\n\n"
        "def test_b():\n    assert step(2) == 3\n"
    )
    target = ml.Target("pkg/core.py", "table", "pkg.core")
    mutant = ml.make_mutant(target, repo / "pkg/core.py", code, "raise", 0)
    runner = ml.Runner(sys.executable, [str(repo)])
    args = [str(repo / "test_table.py"), str(repo / "test_step.py"), f"--rootdir={repo}"]
    try:
        baseline = runner.run(tmp_path, repo, args, timeout=60)
        result = runner.run(tmp_path, repo, args, timeout=60, mutant=mutant)
        narrowed = runner.run(tmp_path, repo, args, timeout=60, only={"test_step.py::test_b"})
    finally:
        runner.close()
    assert len(baseline.passed()) == 3 and not baseline.collect_errors
    assert result.error is None and result.collect_errors == {"test_table.py"}
    assert result.outcomes == {"test_step.py::test_a": "passed", "test_step.py::test_b": "passed"}
    assert ml.failing_tests(baseline, result) == {"test_table.py::test_t"}
    assert narrowed.outcomes == {"test_step.py::test_b": "passed"}, narrowed


def test_the_whole_file_spec_and_a_mutants_share_of_the_baseline(
    bench: ModuleType, sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    """``--reuse-file`` writes a spec the project's loader takes (every test of the files,
    the dtypes named); a path outside the checkout is refused; ``within`` keeps a mutant's
    files and, with ``--scope tests``, its tests."""
    from reuse_specs.loader import load_specs

    ml = sys.modules["mutation_lib"]
    repo = sample_upstream.path
    spec = bench.whole_file_spec(repo, ["test/test_view_ops.py"], "float16, float32")
    loaded = load_specs([spec], repo, "cpu")
    assert [p.name for p in loaded.test_files()] == ["test_view_ops.py"]
    assert "float16" in spec.read_text() and "bfloat16" not in spec.read_text()
    for bad in ("/".join(("..", "outside.py")), "/etc/passwd", "test/missing.py"):
        with pytest.raises(SystemExit, match="no such test file"):
            bench.whole_file_spec(repo, [bad], "")
    baseline = ml.RunResult(
        outcomes={"a.py::T::t_cpu": "passed", "a.py::T::u_cpu": "passed", "b.py::v": "failed"},
        generic={"a.py::T::t_cpu": "a.py::T::t", "a.py::T::u_cpu": "a.py::T::u"},
    )
    assert set(bench.within(baseline, ["a.py"], None).outcomes) == {
        "a.py::T::t_cpu",
        "a.py::T::u_cpu",
    }
    assert set(bench.within(baseline, ["a.py", "b.py"], {"a.py::T::u"}).outcomes) == {
        "a.py::T::u_cpu"
    }
    assert len(bench.within(baseline, ["."], None).outcomes) == 3
    nested = ml.RunResult(outcomes={"tests/a.py::t": "passed", "other/b.py::u": "passed"})
    assert set(bench.within(nested, ["tests"], None).outcomes) == {"tests/a.py::t"}


def test_the_runner_keeps_the_repositorys_own_deselection_and_drops_the_rest(
    bench: ModuleType, tmp_path: Path
) -> None:
    """A repository that deselects its stress tests in addopts (and ignores a folder) gets
    the same choice under the bench; its other addopts (here one that would stop the run at
    the first failure) are dropped."""
    ml = sys.modules["mutation_lib"]
    repo = _package(tmp_path, "def step(x):\n    return x + 1\n")
    (repo / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\n"
        "markers = ['stress']\n"
        "addopts = \"-x -m 'not stress' --ignore=slow\"\n"
    )
    (repo / "slow").mkdir()
    (repo / "slow" / "test_slow.py").write_text("def test_slow():\n    assert False\n")
    (repo / "test_core.py").write_text(
        "import pytest\nfrom pkg.core import step\n\n"
        "def test_fails():\n    assert step(1) == 3\n\n"
        "@pytest.mark.stress\ndef test_stress():\n    assert step(2) == 3\n\n"
        "def test_after():\n    assert step(0) == 1\n"
    )
    assert ml.own_deselection(repo) == f"-m 'not stress' --ignore={repo / 'slow'}"
    runner = ml.Runner(sys.executable, [str(repo)])
    try:
        result = runner.run(tmp_path, repo, [str(repo), f"--rootdir={repo}"], timeout=60)
    finally:
        runner.close()
    assert result.outcomes == {
        "test_core.py::test_fails": "failed",
        "test_core.py::test_after": "passed",  # -x dropped: the run went on
    }, result.outcomes
