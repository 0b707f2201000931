"""torch-spyre's input-generation keys on ``spyre-emu``: ``global.input_config.seed`` is applied
(``torch.manual_seed`` right before each test's body, after PyTorch's own ``setUp`` seeding),
and ``specs show`` and the run summary say which keys are applied and which are not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult

TEST = """\
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase


def _draw_with(seed):
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    value = torch.rand(3)
    torch.set_rng_state(state)
    return value


class TestSeeded(TestCase):
    def test_draw(self, device):
        drawn = torch.rand(3)  # the generator as the test body finds it
        self.assertEqual(drawn, _draw_with(77), atol=0, rtol=0)


instantiate_device_type_tests(TestSeeded, globals())
"""
SPEC = """\
test_suite_config:
  files:
    - path: ${{TORCH_ROOT}}/test/test_seeded.py
      unlisted_test_mode: mandatory_success
      tests:
        - names: [TestSeeded::test_draw]
          edits:
            ops:
              include:
                - name: abs
                  sample_inputs_func: {{kind: custom}}
  global:
    input_config: {{seed: {seed}}}
"""


def _ci_relay(cli: Callable[..., CliResult], tmp_path: Path, seed: int, *command: str) -> CliResult:
    """``specs show`` or ``run`` of the seeded test on spyre-emu."""
    up = tmp_path / "up"
    (up / "test").mkdir(parents=True, exist_ok=True)
    (up / "test" / "test_seeded.py").write_text(TEST)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(seed=seed))
    spec_args = ("--spec", spec) if command[0] == "run" else (spec,)
    return cli(
        *command, *spec_args, "--upstream", up, "--backend", "spyre-emu",
        env={"SPYRE_EMU_LOCK_DIR": str(tmp_path)},
    )  # fmt: skip


@pytest.mark.parametrize("seed, code", [(77, 0), (78, 1)])
def test_the_seed_is_applied_before_the_body(
    cli: Callable[..., CliResult], tmp_path: Path, seed: int, code: int
) -> None:
    done = _ci_relay(cli, tmp_path, seed, "run")
    assert done.code == code, done.stdout + done.stderr
    assert f"input generation applied: global.input_config.seed {seed}" in done.stdout


def test_specs_show_and_the_summary_say_what_is_not_applied(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    shown = _ci_relay(cli, tmp_path, 77, "specs", "show")
    assert shown.code == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if "input generation" in line]
    assert lines[0].startswith("input generation applied: global.input_config.seed 77")
    assert lines[1].startswith("input generation NOT applied: sample_inputs_func at ")
    assert "spec.yaml:11:19" in lines[1]
    ran = _ci_relay(cli, tmp_path, 77, "run")
    assert "input generation NOT applied: sample_inputs_func at " in ran.stdout
