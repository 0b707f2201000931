"""``edits.functions.cpu_move`` on the emulated card: with a profile that lacks the ops
``assertEqual`` compares with (``eq``, ``isclose``, ...), a device test fails inside its
comparison; the same test with ``cpu_move: [assertEqual]`` compares on the CPU and passes,
while its arithmetic still ran on the card. This is how five of torch-spyre's public configs
use it."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult

UPSTREAM = """\
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase, run_tests


class TestCompare(TestCase):
    def test_double(self, device):
        t = torch.ones(4, device=device)
        doubled = t + t
        self.assertEqual(doubled.device.type, "spyre")  # the sum ran on the card
        self.assertEqual(doubled, torch.full((4,), 2.0, device=device))


instantiate_device_type_tests(TestCompare, globals())
"""
PROFILE = """\
name: no-comparisons
dtypes: [float16, float32, int64, bool]
unsupported_ops: [eq, ne, isclose, isfinite, isnan, abs, sub]
"""
SPEC = """\
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_cmp.py
      unlisted_test_mode: mandatory_success
"""
MOVED = (
    SPEC
    + """\
      tests:
        - names: [TestCompare::test_double]
          edits:
            functions:
              cpu_move: [{name: assertEqual}]
"""
)


def _run(cli: Callable[..., CliResult], tmp_path: Path, spec_text: str) -> tuple[int, str, str]:
    """(exit code, outcome, failure text) of test_double on spyre-emu."""
    up = tmp_path / "up"
    (up / "test").mkdir(parents=True, exist_ok=True)
    (up / "test" / "test_cmp.py").write_text(UPSTREAM)
    (tmp_path / "profile.yaml").write_text(PROFILE)
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text)
    junit = tmp_path / "junit.xml"
    env = {"SPYRE_EMU_PROFILE": str(tmp_path / "profile.yaml"), "SPYRE_EMU_LOCK_DIR": str(tmp_path)}
    done = cli("run", "--spec", spec, "--upstream", up, "--backend", "spyre-emu",
               "--junit", junit, env=env)  # fmt: skip
    (case,) = ET.parse(junit).iter("testcase")
    failure = case.find("failure")
    outcome = "failed" if failure is not None else "passed"
    return done.code, outcome, (failure.text or "") if failure is not None else ""


@pytest.mark.parametrize("moved", [False, True], ids=["without", "with cpu_move"])
def test_cpu_move_compares_on_the_cpu(
    cli: Callable[..., CliResult], tmp_path: Path, moved: bool
) -> None:
    code, outcome, text = _run(cli, tmp_path, MOVED if moved else SPEC)
    if moved:
        assert (code, outcome) == (0, "passed"), text
    else:
        assert (code, outcome) == (1, "failed")
        assert "UnsupportedOpError" in text and "spyre-emu profile 'no-comparisons'" in text
