"""``edits.ops.include`` adds ops to an upstream ``@ops`` test on the device, as torch-spyre
does: the test gets variants for an op its upstream list lacks, with the spec's dtypes, and
they run on ``spyre-emu``; an op the spec does not include gets none; without the include
the test has only its upstream ops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def _ci_relay(tmp_path: Path, include: bool, *args: str) -> subprocess.CompletedProcess[str]:
    up = tmp_path / "up"
    (up / "test").mkdir(parents=True, exist_ok=True)
    (up / "test" / "test_opinc.py").write_text(UPSTREAM)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(edits=INCLUDE if include else ""))
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ROOT"}
    env.update(SPYRE_EMU_LOCK_DIR=str(tmp_path), COLUMNS="200")
    spec_args = ["--spec", str(spec)] if args[0] == "run" else [str(spec)]
    return subprocess.run(
        [sys.executable, "-m", "ci_relay", *args, *spec_args, "--upstream", str(up),
         "--backend", "spyre-emu"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip


def _variants(tmp_path: Path, include: bool) -> dict[tuple[str | None, str | None], str]:
    shown = _ci_relay(tmp_path, include, "specs", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    return {(r["op"], r["dtype"]): r["mode"] for r in json.loads(shown.stdout)}


@pytest.mark.parametrize("include", [False, True], ids=["upstream ops", "with include"])
def test_an_included_op_gets_variants_with_the_specs_dtypes(tmp_path: Path, include: bool) -> None:
    variants = _variants(tmp_path, include)
    ops = {op for op, _ in variants}
    assert "abs" in ops
    assert ("neg" in ops) is include
    assert "exp" not in ops  # not included: no variant
    if include:
        runnable = {
            dtype for (op, dtype), mode in variants.items() if op == "neg" and mode != "skip"
        }
        assert runnable == {"float32"}  # the spec's supported_dtypes


def test_the_included_op_runs_on_the_card(tmp_path: Path) -> None:
    done = _ci_relay(tmp_path, True, "run", "--junit", str(tmp_path / "junit.xml"))
    assert done.returncode == 0, done.stdout + done.stderr
    junit = (tmp_path / "junit.xml").read_text()
    assert 'name="test_runs_neg_spyre_float32"' in junit
    assert 'name="test_runs_abs_spyre_float32"' in junit
