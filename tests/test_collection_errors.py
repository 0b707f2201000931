"""A real upstream file that does not import on the installed torch (an older or newer
PyTorch test file) is that file's error result; every other file still runs: in
``ci-relay run``, in ``specs show`` and in a shard."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ci_relay.execution.runtimes.local import LocalRuntime
from ci_relay.execution.shard import ShardRequest, run_shard
from tests.conftest import CliResult

GOOD = """
import torch
from torch.testing._internal.common_utils import TestCase


class TestGood(TestCase):
    def test_one(self):
        self.assertEqual(torch.ones(2).sum().item(), 2.0)

    def test_two(self):
        self.assertTrue(True)
"""
# what old PyTorch test files do: torch._six is long gone
BROKEN = """
from torch._six import inf

from torch.testing._internal.common_utils import TestCase


class TestBroken(TestCase):
    def test_never_collected(self):
        self.assertEqual(inf, inf)
"""
SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_good.py
      unlisted_test_mode: mandatory_success
    - path: ${TORCH_ROOT}/test/test_broken.py
      unlisted_test_mode: mandatory_success
"""


def _upstream(tiny_upstream: Callable[[dict[str, str]], Path]) -> Path:
    return tiny_upstream({"test/test_good.py": GOOD, "test/test_broken.py": BROKEN})


def test_run_reports_the_file_and_runs_the_rest(
    cli: Callable[..., CliResult],
    write_spec: Callable[..., Path],
    tiny_upstream: Callable[[dict[str, str]], Path],
    tmp_path: Path,
) -> None:
    upstream = _upstream(tiny_upstream)
    junit = tmp_path / "junit.xml"
    result = cli("run", "--spec", write_spec(SPEC), "--upstream", upstream, "--junit", junit)
    assert result.code == 1, result.output  # a failure, not an infrastructure error
    assert "COLLECTION ERROR test/test_broken.py" in result.stdout
    assert "No module named 'torch._six'" in result.stdout
    text = junit.read_text()
    assert 'name="test_one"' in text and 'name="test_two"' in text  # the rest ran


def test_specs_show_lists_the_rest_and_names_the_file(
    cli: Callable[..., CliResult],
    write_spec: Callable[..., Path],
    tiny_upstream: Callable[[dict[str, str]], Path],
) -> None:
    upstream = _upstream(tiny_upstream)
    result = cli("specs", "show", write_spec(SPEC), "--upstream", upstream, "--json")
    assert result.code == 1
    listed = {row["test"] for row in json.loads(result.stdout)}
    assert listed == {"test_one", "test_two"}
    assert "COLLECTION ERROR test/test_broken.py: collection error:" in result.stderr
    assert "1 file(s) could not be collected; the other variants are listed" in result.stderr


def test_a_shard_stores_the_files_error_beside_the_other_results(
    write_spec: Callable[..., Path],
    tiny_upstream: Callable[[dict[str, str]], Path],
    tmp_path: Path,
) -> None:
    upstream = _upstream(tiny_upstream)
    report = run_shard(
        LocalRuntime(),
        ShardRequest(
            tests=[
                "test/test_good.py::TestGood::test_one",
                "test/test_good.py::TestGood::test_two",
                "test/test_broken.py::TestBroken::test_never_collected",
            ],
            specs=[write_spec(SPEC)],
            upstream=upstream,
            scratch=tmp_path / "scratch",
            per_test_timeout=60,
        ),
    )
    assert report.error is None
    outcomes = {nodeid: r.outcome for nodeid, r in report.results.items()}
    assert outcomes == {
        "test/test_good.py::TestGood::test_one": "passed",
        "test/test_good.py::TestGood::test_two": "passed",
        "test/test_broken.py": "error",
    }
    broken = report.results["test/test_broken.py"]
    assert broken.message.startswith("collection error: ModuleNotFoundError")
    assert "torch._six" in broken.details
