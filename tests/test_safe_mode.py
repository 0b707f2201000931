"""Safe mode (issue 55, item 6): ``select --mode safe`` spends no budget and takes every
test the change can be shown to reach (the coverage map, imports, names, the tests it
edits, a changed conftest.py or pytest configuration), each with why; through the real CLI
on the sample upstream and on a repository whose map the real recorder writes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ci_relay.sample_upstream import SampleUpstream
from tests.conftest import CliResult
from tests.test_coverage_floor import TESTS, _edit, _record, _upstream


def _safe(cli: Callable[..., CliResult], upstream: Path, *extra: str | Path) -> Any:
    done = cli(
        "select", "--upstream", upstream, "--base", "HEAD~1", "--head", "HEAD",
        "--mode", "safe", "--agent", "none", "--json", *extra,
    )  # fmt: skip
    assert done.code == 0, done.output
    return json.loads(done.stdout)


def _why(plan: Any) -> dict[str, str]:
    return {t["test"]: t["reasons"][0] for t in plan["selected"]}


def test_safe_mode_on_the_sample_upstream_takes_what_the_change_reaches_and_no_budget(
    sample_upstream: SampleUpstream, cli: Callable[..., CliResult]
) -> None:
    # the newest commit decomposes gelu: edits test_nn_functional.py, no map
    plan = _safe(cli, sample_upstream.path, "--budget", "1")
    assert plan["mode"] == "safe" and plan["budget"] == "none (safe mode)"
    why = _why(plan)
    added = "test/test_nn_functional.py::TestNNFunctional::test_gelu_tanh_approximation"
    named = "test/test_nn_functional.py::TestNNFunctional::test_gelu_matches_erf_formula"
    assert why[added] == "safe mode: the change adds or edits this test"
    assert why[named] == "safe mode: names a changed def or op"
    # the budget of one test does not bound it; the tests of other ops are not reached
    assert len(plan["selected"]) >= 2
    assert not any("test_binary_ufuncs" in t for t in why), why
    share = f"safe mode: {len(why)} of {plan['universe_size']} test(s)"
    assert any(n.startswith(share) and "no usable coverage map" in n for n in plan["notes"])
    assert any("native_functions.yaml" in n for n in plan["notes"])  # traced by op names only


def test_safe_mode_with_a_map_takes_every_test_that_executed_the_change(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, base = _upstream(tmp_path)
    cmap = tmp_path / "map.json.gz"
    _record(cli, repo, base, cmap)
    new_file = "from pkg.core import dispatch\n\n\ndef test_new():\n    assert dispatch(1) == 3\n"
    repo.commit(
        "fix 23; a test file the map does not know",
        {"pkg/core.py": _edit(23), "tests/test_new.py": new_file},
        dedent=False,
    )
    plan = _safe(cli, repo.path, "--coverage", cmap)
    why = _why(plan)
    mapped = "safe mode: executed a changed function in the coverage map"
    # test_all ran every implementation: with the map it is in, whatever its rank
    assert why == {
        "tests/test_new.py::test_new": "safe mode: the change adds or edits this test",
        "tests/test_core.py::test_all": mapped,
        "tests/test_core.py::test_case_23": mapped,
    }
    assert any(n.startswith("safe mode: 3 of 42 test(s) (7.1%)") for n in plan["notes"])
    # nothing ranks in safe mode: the map's tests carry its evidence, and the plan says so
    assert plan["coverage"]["used"] == "evidence" and not plan["ranking"]


def test_safe_mode_runs_everything_below_a_changed_conftest_and_all_on_new_settings(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, base = _upstream(tmp_path)
    cmap = tmp_path / "map.json.gz"
    _record(cli, repo, base, cmap)
    repo.commit("a fixture", {"tests/conftest.py": "import pytest\n"}, dedent=False)
    plan = _safe(cli, repo.path, "--coverage", cmap)
    assert len(plan["selected"]) == plan["universe_size"] == len(TESTS.split("def test_")) - 1
    assert set(_why(plan).values()) == {"safe mode: below the changed tests/conftest.py"}
    repo.commit(
        "pytest settings", {"pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-x'\n"}
    )
    plan = _safe(cli, repo.path, "--coverage", cmap)
    assert set(_why(plan).values()) == {"safe mode: pytest's settings in pyproject.toml changed"}
    # a change that reaches nothing runs nothing, and says so
    repo.commit("docs", {"README.md": "words\n"})
    plan = _safe(cli, repo.path, "--coverage", cmap)
    assert plan["selected"] == [] and any(n.startswith("safe mode: 0 of") for n in plan["notes"])


def test_an_unknown_mode_is_refused_with_the_modes(
    sample_upstream: SampleUpstream, cli: Callable[..., CliResult]
) -> None:
    done = cli(
        "select", "--upstream", sample_upstream.path, "--base", "HEAD~1", "--head", "HEAD",
        "--mode", "fast", "--agent", "none",
    )  # fmt: skip
    assert done.code == 2
    assert "unknown mode 'fast' (one of ranked, safe)" in done.output
