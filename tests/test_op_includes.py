"""``edits.ops.include`` adds ops to an upstream ``@ops`` test on the device, as torch-spyre
does: the test gets variants for an op its upstream list lacks, with the spec's dtypes, and
they run on ``spyre-emu``; an op the spec does not include gets none; without the include
the test has only its upstream ops."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult

UPSTREAM = """\
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests

ABS = [op for op in op_db if op.name == "abs"]


class TestOpInc(TestCase):
    @ops(ABS)
    def test_runs(self, device, dtype, op):
        for sample in op.sample_inputs(device, dtype):
            result = op(sample.input, *sample.args, **sample.kwargs)
            self.assertEqual(result.device.type, torch.device(device).type)


instantiate_device_type_tests(TestOpInc, globals())
"""
SPEC = """\
test_suite_config:
  files:
    - path: ${{TORCH_ROOT}}/test/test_opinc.py
      unlisted_test_mode: mandatory_success
      tests:
        - names: [TestOpInc::test_runs]
{edits}
  global:
    supported_dtypes: [{{name: float32}}]
"""
INCLUDE = "          edits:\n            ops:\n              include: [{name: neg}]"


def _write(tmp_path: Path, include: bool) -> tuple[Path, Path]:
    """The upstream tree and the spec (with or without the include)."""
    up = tmp_path / "up"
    (up / "test").mkdir(parents=True, exist_ok=True)
    (up / "test" / "test_opinc.py").write_text(UPSTREAM)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(edits=INCLUDE if include else ""))
    return up, spec


def _on_emu(up: Path) -> tuple[str, ...]:
    return ("--upstream", str(up), "--backend", "spyre-emu")


def _variants(
    cli: Callable[..., CliResult], tmp_path: Path, include: bool
) -> dict[tuple[str | None, str | None], str]:
    up, spec = _write(tmp_path, include)
    shown = cli(
        "specs", "show", spec, *_on_emu(up), "--json", env={"SPYRE_EMU_LOCK_DIR": str(tmp_path)}
    )
    assert shown.code == 0, shown.stderr
    return {(r["op"], r["dtype"]): r["mode"] for r in json.loads(shown.stdout)}


@pytest.mark.parametrize("include", [False, True], ids=["upstream ops", "with include"])
def test_an_included_op_gets_variants_with_the_specs_dtypes(
    cli: Callable[..., CliResult], tmp_path: Path, include: bool
) -> None:
    variants = _variants(cli, tmp_path, include)
    ops = {op for op, _ in variants}
    assert "abs" in ops
    assert ("neg" in ops) is include
    assert "exp" not in ops  # not included: no variant
    if include:
        runnable = {
            dtype for (op, dtype), mode in variants.items() if op == "neg" and mode != "skip"
        }
        assert runnable == {"float32"}  # the spec's supported_dtypes


def test_the_included_op_runs_on_the_card(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    up, spec = _write(tmp_path, True)
    junit = tmp_path / "junit.xml"
    env = {"SPYRE_EMU_LOCK_DIR": str(tmp_path)}
    done = cli("run", "--spec", spec, *_on_emu(up), "--junit", junit, env=env)
    assert done.code == 0, done.stdout + done.stderr
    junit = (tmp_path / "junit.xml").read_text()
    assert 'name="test_runs_neg_spyre_float32"' in junit
    assert 'name="test_runs_abs_spyre_float32"' in junit
