"""Shards in real sandboxes (bubblewrap): faults cost one test, never the shard's results."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ci_relay.execution.runtimes import Limits, LocalRuntime, RuntimeUnavailable, get_runtime
from ci_relay.execution.shard import ShardReport, ShardRequest, run_shard
from tests.conftest import CliResult

pytestmark = pytest.mark.slow
FAULTS = Path(__file__).parent / "data" / "faults"
SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_faults.py
      unlisted_test_mode: mandatory_success
"""
NAMES = [
    "test_a_ok",
    "test_b_segfault",
    "test_c_ok",
    "test_d_hang",
    "test_e_network",
    "test_f_secret",
    "test_g_write_outside",
    "test_h_memory",
    "test_i_flaky",
    "test_j_ok",
]


@pytest.fixture(scope="module", params=["sandbox", "container"])
def sandbox_report(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ShardReport:
    """The fault suite in each isolating runtime (the container one on Podman, for real)."""
    root = tmp_path_factory.mktemp(f"faults-{request.param}")
    upstream = root / "up"
    shutil.copytree(FAULTS, upstream)
    spec = root / "spec.yaml"
    spec.write_text(SPEC)
    os.environ["MY_SECRET"] = "worker-secret"  # in the worker's environment, never the shard's
    try:
        shard = ShardRequest(
            tests=[f"test/test_faults.py::TestFaults::{n}" for n in NAMES],
            specs=[spec],
            upstream=upstream,
            scratch=root / "scratch",
            per_test_timeout=10,
            limits=Limits(memory_mb=1536, pids=256, wall_seconds=600),
        )
        return run_shard(get_runtime(request.param), shard)
    finally:
        del os.environ["MY_SECRET"]


def _outcome(report: ShardReport, name: str) -> tuple[str, str]:
    record = report.results[f"test/test_faults.py::TestFaults::{name}"]
    return record.outcome, record.message


def test_every_test_has_a_result(sandbox_report: ShardReport) -> None:
    assert sorted(n.rsplit("::", 1)[1] for n in sandbox_report.results) == NAMES
    assert _outcome(sandbox_report, "test_a_ok")[0] == "passed"
    assert _outcome(sandbox_report, "test_c_ok")[0] == "passed"  # after the segfault
    assert _outcome(sandbox_report, "test_j_ok")[0] == "passed"  # after the hang
    assert sandbox_report.error is None


def test_a_segfault_is_recorded_as_crashed(sandbox_report: ShardReport) -> None:
    assert _outcome(sandbox_report, "test_b_segfault") == (
        "crashed",
        "the test process died of SIGSEGV",
    )


def test_a_hang_is_killed_at_its_timeout(sandbox_report: ShardReport) -> None:
    outcome, message = _outcome(sandbox_report, "test_d_hang")
    assert outcome == "crashed" and "longer than its 10s timeout" in message


def test_no_network_no_secrets_read_only_root(sandbox_report: ShardReport) -> None:
    outcome, message = _outcome(sandbox_report, "test_e_network")
    assert outcome == "failed" and "Connection refused" in message  # Redis listens outside only
    assert _outcome(sandbox_report, "test_f_secret")[0] == "passed"
    outcome, message = _outcome(sandbox_report, "test_g_write_outside")
    assert outcome == "failed" and "Read-only file system" in message
    assert not Path("/etc/ci-relay-should-not-exist").exists()


def test_memory_limit_stops_the_allocation(sandbox_report: ShardReport) -> None:
    outcome, message = _outcome(sandbox_report, "test_h_memory")
    assert outcome in ("failed", "crashed") and ("MemoryError" in message or "died" in message)


def test_failures_are_rerun_once_to_find_flakes(sandbox_report: ShardReport) -> None:
    record = sandbox_report.results["test/test_faults.py::TestFaults::test_i_flaky"]
    assert record.outcome == "passed" and record.flaky and "flaky" in record.message


def test_local_runtime_also_survives_a_crash(tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    shutil.copytree(FAULTS, upstream)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    request = ShardRequest(
        tests=[
            f"test/test_faults.py::TestFaults::{n}"
            for n in ("test_a_ok", "test_b_segfault", "test_c_ok")
        ],
        specs=[spec],
        upstream=upstream,
        scratch=tmp_path / "s",
        per_test_timeout=30,
    )
    report = run_shard(LocalRuntime(), request)
    assert [r.outcome for r in report.results.values()] == ["passed", "crashed", "passed"]
    assert report.processes == 2
    crashed = report.results["test/test_faults.py::TestFaults::test_b_segfault"]
    assert crashed.details.startswith("the test process died of SIGSEGV\n\n")
    assert "Fatal Python error: Segmentation fault" in crashed.details
    assert "in test_b_segfault" in crashed.details  # faulthandler's stack of the dying test


def test_missing_image_names_the_build_command() -> None:
    with pytest.raises(RuntimeUnavailable, match="build it with `ci-relay images build`"):
        get_runtime("container", backend="no-such-backend")


@pytest.mark.parametrize("runtime", ["sandbox", "container"])
def test_run_with_a_runtime_from_the_cli(
    runtime: str, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    upstream = tmp_path / "up"
    shutil.copytree(FAULTS, upstream)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("mandatory_success", "xfail"))
    tests = tmp_path / "tests.txt"
    tests.write_text(
        "test/test_faults.py::TestFaults::test_a_ok\ntest/test_faults.py::TestFaults::test_b_segfault\n"
    )
    junit = tmp_path / "j.xml"
    result = cli(
        "run",
        "--spec",
        spec,
        "--upstream",
        upstream,
        "--runtime",
        runtime,
        "--tests",
        tests,
        "--junit",
        junit,
    )
    assert result.code == 1, result.output  # a crash is never an expected outcome
    assert "CRASHED test/test_faults.py::TestFaults::test_b_segfault" in result.stdout
    assert f"{runtime}: 2 process(es), 1 crashed" in result.stdout
    text = junit.read_text()
    assert 'type="crashed"' in text and 'name="test_a_ok"' in text
    unknown = cli("run", "--spec", spec, "--upstream", upstream, "--runtime", "vm")
    assert unknown.code == 2 and "unknown runtime 'vm'" in unknown.stderr
