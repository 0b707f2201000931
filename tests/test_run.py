"""``ci-relay run`` end to end: real pytest sessions over real upstream test files."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from ci_relay.sample_upstream import SampleUpstream
from tests.conftest import BUNDLED_SPECS, CliResult

pytestmark = pytest.mark.slow

MODES_TEST = """
import pathlib

import torch
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase

TRACE = pathlib.Path(__file__).with_name("trace.log")


def trace(name):
    with TRACE.open("a") as f:
        f.write(name + "\\n")


class TestModes(TestCase):
    def test_passes(self, device):
        trace("passes")

    def test_fails(self, device):
        trace("fails")
        self.assertEqual(1, 2)

    def test_never_runs(self, device):
        trace("never_runs")

    def test_grad_mode(self, device):
        self.assertFalse(torch.is_grad_enabled())

    @dtypes(torch.float16, torch.float32)
    def test_tolerance(self, device, dtype):
        one = torch.tensor(1.0, dtype=dtype, device=device)
        self.assertEqual(one, one + 0.05)


instantiate_device_type_tests(TestModes, globals())
"""


def _spec(tests: str, unlisted: str = "skip", global_: str = "") -> str:
    return f"""
test_suite_config:
  files:
    - path: ${{TORCH_ROOT}}/test/test_modes.py
      unlisted_test_mode: {unlisted}
      tests:
{tests}
{global_}
"""


def _junit(path: Path) -> dict[str, tuple[str, dict[str, list[str]]]]:
    """testcase name -> (result tag or 'passed', properties)."""
    cases = {}
    for case in ET.parse(path).iter("testcase"):
        result = next(
            (
                c.tag
                for c in case
                if c.tag != "properties" and c.tag not in ("system-out", "system-err")
            ),
            "passed",
        )
        props: dict[str, list[str]] = {}
        for prop in case.iter("property"):
            props.setdefault(prop.get("name", ""), []).append(prop.get("value", ""))
        cases[case.get("name", "")] = (result, props)
    return cases


@pytest.fixture
def modes_upstream(tiny_upstream: Callable[[dict[str, str]], Path]) -> Path:
    return tiny_upstream({"test/test_modes.py": MODES_TEST})


def _trace(upstream: Path) -> list[str]:
    log = upstream / "test" / "trace.log"
    return log.read_text().split() if log.exists() else []


def test_modes_tags_and_runtime_edits_as_expected(
    cli: Callable[..., CliResult],
    write_spec: Callable[..., Path],
    modes_upstream: Path,
    tmp_path: Path,
) -> None:
    spec = write_spec(
        _spec(
            """        - names: [TestModes::test_passes]
          tags: [smoke, model_a]
        - names: [TestModes::test_fails]
          mode: xfail
        - names: [TestModes::test_never_runs]
          mode: skip
        - names: [TestModes::test_grad_mode]
          no_grad: true
        - names: [TestModes::test_tolerance]""",
            global_="""  global:
    supported_dtypes:
      - {name: float16, precision: {atol: 0.1, rtol: 0.01}}
      - {name: float32, precision: {atol: 0.1}}""",
        )
    )
    junit = tmp_path / "out" / "junit.xml"
    result = cli("run", "--spec", spec, "--upstream", modes_upstream, "--junit", junit)
    assert result.code == 0, result.output
    assert sorted(_trace(modes_upstream)) == ["fails", "passes"]  # skip never executes
    cases = _junit(junit)
    assert cases["test_passes_cpu"][0] == "passed"
    assert cases["test_passes_cpu"][1]["reuse_spec.tag"] == ["smoke", "model_a"]
    assert cases["test_passes_cpu"][1]["reuse_spec.mode"] == ["mandatory_success"]
    assert cases["test_fails_cpu"][0] == "skipped"  # pytest's xunit2 form of an xfail
    assert cases["test_fails_cpu"][1]["reuse_spec.mode"] == ["xfail"]
    assert cases["test_never_runs_cpu"][0] == "skipped"
    assert cases["test_grad_mode_cpu"][0] == "passed"
    assert cases["test_tolerance_cpu_float16"][0] == "passed"
    assert cases["test_tolerance_cpu_float32"][0] == "passed"
    assert "mandatory_success" in result.stdout and "xfail" in result.stdout


def test_must_pass_failure_fails_the_run(
    cli: Callable[..., CliResult], write_spec: Callable[..., Path], modes_upstream: Path
) -> None:
    spec = write_spec(
        _spec(
            """        - names: [TestModes::test_fails, TestModes::test_grad_mode, TestModes::test_tolerance]"""
        )
    )
    result = cli("run", "--spec", spec, "--upstream", modes_upstream)
    assert result.code == 1, result.output
    # without the spec's no_grad and precision, those tests fail too
    for name in (
        "test_fails_cpu",
        "test_grad_mode_cpu",
        "test_tolerance_cpu_float16",
        "test_tolerance_cpu_float32",
    ):
        assert f"FAILED test/test_modes.py::TestModesCPU::{name}" in result.stdout
    assert "never_runs" not in _trace(modes_upstream)


def test_xfail_strict_and_xfail_follow_pytest(
    cli: Callable[..., CliResult],
    write_spec: Callable[..., Path],
    modes_upstream: Path,
    tmp_path: Path,
) -> None:
    lenient = write_spec(
        _spec(
            """        - names: [TestModes::test_passes, TestModes::test_fails]
          mode: xfail"""
        )
    )
    junit = tmp_path / "lenient.xml"
    result = cli("run", "--spec", lenient, "--upstream", modes_upstream, "--junit", junit)
    assert result.code == 0, result.output  # an xfail test that passes is tolerated
    cases = _junit(junit)
    assert cases["test_passes_cpu"][0] == "passed" and cases["test_fails_cpu"][0] == "skipped"

    strict = write_spec(
        _spec(
            """        - names: [TestModes::test_passes, TestModes::test_fails]
          mode: xfail_strict"""
        )
    )
    junit = tmp_path / "strict.xml"
    result = cli("run", "--spec", strict, "--upstream", modes_upstream, "--junit", junit)
    assert result.code == 1, result.output  # an xfail_strict test that passes fails the run
    assert "XPASS_STRICT test/test_modes.py::TestModesCPU::test_passes_cpu" in result.stdout
    cases = _junit(junit)
    assert cases["test_passes_cpu"][0] == "failure" and cases["test_fails_cpu"][0] == "skipped"


def test_unlisted_test_mode_applies(
    cli: Callable[..., CliResult],
    write_spec: Callable[..., Path],
    modes_upstream: Path,
    tmp_path: Path,
) -> None:
    listed = """        - names: [TestModes::test_passes]"""
    tolerant = write_spec(_spec(listed, unlisted="xfail"))
    junit = tmp_path / "unlisted.xml"
    result = cli("run", "--spec", tolerant, "--upstream", modes_upstream, "--junit", junit)
    assert result.code == 0, result.output
    cases = _junit(junit)
    assert cases["test_fails_cpu"][1]["reuse_spec.mode"] == ["xfail"]
    assert "not listed" in cases["test_fails_cpu"][1]["reuse_spec.reason"][0]
    assert "never_runs" in _trace(modes_upstream)  # xfail tests do run

    demanding = write_spec(_spec(listed, unlisted="mandatory_success"))
    result = cli("run", "--spec", demanding, "--upstream", modes_upstream)
    assert result.code == 1
    assert (
        "FAILED test/test_modes.py::TestModesCPU::test_fails_cpu (mode mandatory_success)"
        in result.stdout
    )


def test_bundled_specs_on_sample_upstream(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    result = cli(
        "run", "--spec", BUNDLED_SPECS, "--upstream", sample_upstream.path, "--junit", junit
    )
    assert result.code == 0, result.output
    cases = _junit(junit)
    # a float16 test that only passes with the spec's precision override
    assert cases["test_prod_reference_cpu_float16"][0] == "passed"
    # a real upstream failure expected by xfail_strict
    floor = cases["test_floor_divide_rounds_toward_zero_cpu"]
    assert floor[0] == "skipped" and floor[1]["reuse_spec.mode"] == ["xfail_strict"]
    # ops outside supported_ops and dtypes outside supported_dtypes are skipped with a reason
    sin = cases["test_contig_vs_every_other_sin_cpu_float16"]
    assert (
        sin[0] == "skipped"
        and "'sin' is not in global.supported_ops" in sin[1]["reuse_spec.reason"][0]
    )
    f64 = cases["test_add_cpu_float64"]
    assert (
        f64[0] == "skipped"
        and "float64 is not in global.supported_dtypes" in f64[1]["reuse_spec.reason"][0]
    )
    # sqrt is must-pass (torch-spyre's published list has it; it used to be force_xfail)
    sqrt = cases["test_contig_vs_every_other_sqrt_cpu_float32"]
    assert sqrt[0] == "passed" and sqrt[1]["reuse_spec.mode"] == ["mandatory_success"]
    # plain TestCase classes (not device-instantiated) are covered too
    assert cases["test_relu_inplace"][0] == "passed"
    # the upstream tree is never edited: no caches, no bytecode, no changes
    status = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"],
        cwd=sample_upstream.path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert status.stdout == ""


def test_precision_override_is_what_makes_fp16_pass(
    cli: Callable[..., CliResult], write_spec: Callable[..., Path], sample_upstream: SampleUpstream
) -> None:
    spec = write_spec(
        """
        test_suite_config:
          files:
            - path: ${TORCH_ROOT}/test/test_binary_ufuncs.py
              unlisted_test_mode: skip
              tests:
                - names: [TestBinaryUfuncs::test_prod_reference]
          global:
            supported_dtypes: [{name: float16}]
        """
    )
    result = cli("run", "--spec", spec, "--upstream", sample_upstream.path)
    assert result.code == 1
    assert (
        "FAILED test/test_binary_ufuncs.py::TestBinaryUfuncsCPU::test_prod_reference_cpu_float16"
        in result.stdout
    )


def test_specs_show_lists_every_variant_with_mode_and_reason(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream
) -> None:
    result = cli(
        "specs",
        "show",
        BUNDLED_SPECS / "spyre_unary_ufuncs.yaml",
        "--upstream",
        sample_upstream.path,
        "--json",
    )
    assert result.code == 0, result.output
    rows = {row["nodeid"].split("::")[-1]: row for row in json.loads(result.stdout)}
    assert len(rows) == 42
    exp16 = rows["test_contig_vs_every_other_exp_cpu_float16"]
    assert (
        exp16["mode"] == "mandatory_success"
        and exp16["op"] == "exp"
        and exp16["dtype"] == "float16"
    )
    assert exp16["precision"] == {"atol": 0.01, "rtol": 0.01}
    assert rows["test_out_arg_all_dtypes_abs_cpu_float32"]["mode"] == "skip"
    table = cli(
        "specs", "show", BUNDLED_SPECS / "spyre_view_ops.yaml", "--upstream", sample_upstream.path
    )
    assert table.code == 0 and "10 test variants on backend cpu" in table.stdout
    assert "test_ravel" in table.stdout and "mandatory_success" in table.stdout


def test_label_filter(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    junit = tmp_path / "nightly.xml"
    result = cli(
        "run",
        "--spec",
        BUNDLED_SPECS / "spyre_view_ops.yaml",
        "--upstream",
        sample_upstream.path,
        "--label",
        "nightly",
        "--junit",
        junit,
    )
    assert result.code == 0, result.output
    cases = _junit(junit)
    assert cases["test_expand_view_cpu_float32"][1]["reuse_spec.mode"] == ["xfail"]
    view = cases["test_view_shares_storage_cpu"]
    assert view[0] == "skipped" and "label 'nightly'" in view[1]["reuse_spec.reason"][0]
