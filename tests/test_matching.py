"""Per-variant decisions: modes, dtype/op filtering, force_xfail, precision, labels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from reuse_specs import Mode, load_specs
from reuse_specs.matching import Decision, TestVariant, decide

SPEC = """
test_suite_config:
  labels: [trunk]
  files:
    - path: ${TORCH_ROOT}/test/test_x.py
      unlisted_test_mode: skip
      tests:
        - names: [TestX::test_exact]
          mode: xfail_strict
        - names: ["TestX::test_*"]
          mode: xfail
          tags: [wide]
        - names: [test_bare]
          tags: [bare]
        - names: [TestX::test_ops]
          edits:
            ops:
              include: [{name: tanh, tags: [act]}]
              exclude: [{name: sub}]
            dtypes:
              include: [{name: float64, precision: {atol: 0.5}}, {name: int8, force_xfail: true}]
              exclude: [{name: float32}]
        - names: [TestX::test_nightly]
          labels: [nightly]
        - names: [TestX::test_modules]
          edits:
            modules: {exclude: [{name: nn.Conv2d}], include: [{name: torch.nn.GELU}]}
  global:
    supported_dtypes:
      - {name: float16, precision: {atol: 0.01, rtol: 0.02}}
      - {name: float32}
      - {name: bfloat16, force_xfail: true}
    supported_ops:
      - add
      - sub
      - {name: mul, force_xfail: true}
      - {name: div, dtypes: [{name: float16, precision: {atol: 0.1}}]}
    supported_modules:
      - torch.nn.Linear
      - {name: torch.nn.ReLU, force_xfail: true}
      - {name: torch.nn.Conv2d, dtypes: [{name: float32}]}
"""


@pytest.fixture
def decide_for(write_spec: Callable[..., Path], tmp_path: Path) -> Callable[..., Decision | None]:
    (tmp_path / "test").mkdir()
    test_file = tmp_path / "test" / "test_x.py"
    test_file.write_text("# placeholder\n")
    spec = load_specs([write_spec(SPEC)], tmp_path)

    def run(cls: str | None, name: str, label: str | None = None, **kw: str) -> Decision | None:
        return decide(spec, TestVariant(test_file, cls, name, **kw), label)

    return run


def _mode(decision: Decision | None) -> Mode:
    assert decision is not None
    return decision.mode


def test_exact_name_beats_glob_and_unlisted_uses_file_mode(
    decide_for: Callable[..., Decision | None],
) -> None:
    exact = decide_for("TestX", "test_exact")
    assert exact is not None and exact.mode is Mode.XFAIL_STRICT and exact.listed
    assert "listed as 'TestX::test_exact'" in exact.reason
    glob = decide_for("TestX", "test_other")
    assert glob is not None and glob.mode is Mode.XFAIL and glob.tags == ("wide",)
    assert "matched as 'TestX::test_*'" in glob.reason
    unlisted = decide_for("TestY", "test_other")
    assert unlisted is not None and unlisted.mode is Mode.SKIP and not unlisted.listed
    assert "unlisted_test_mode skip" in unlisted.reason


def test_bare_name_matches_any_class(decide_for: Callable[..., Decision | None]) -> None:
    assert _mode(decide_for("TestZ", "test_bare")) is Mode.MANDATORY_SUCCESS
    assert _mode(decide_for(None, "test_bare")) is Mode.MANDATORY_SUCCESS


def test_files_outside_the_spec_are_not_decided(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_x.py").write_text("")
    spec = load_specs([write_spec(SPEC)], tmp_path)
    assert decide(spec, TestVariant(tmp_path / "other.py", "A", "test_b")) is None


def test_dtype_filter_is_global_plus_includes_minus_excludes(
    decide_for: Callable[..., Decision | None],
) -> None:
    # global supported_dtypes decide for tests without edits
    assert _mode(decide_for("TestX", "test_exact", dtype="float16")) is Mode.XFAIL_STRICT
    skipped = decide_for("TestX", "test_exact", dtype="float64")
    assert skipped is not None and skipped.mode is Mode.SKIP
    assert "float64 is not in global.supported_dtypes" in skipped.reason
    # the test's includes add a dtype, its excludes remove one
    included = decide_for("TestX", "test_ops", op="add", dtype="float64")
    assert included is not None and included.mode is Mode.MANDATORY_SUCCESS
    assert included.precision is not None and included.precision.atol == 0.5
    excluded = decide_for("TestX", "test_ops", op="add", dtype="float32")
    assert excluded is not None and excluded.mode is Mode.SKIP and "excluded" in excluded.reason


def test_ops_filter_and_force_xfail(decide_for: Callable[..., Decision | None]) -> None:
    assert (
        _mode(decide_for("TestX", "test_ops", op="add", dtype="float16")) is Mode.MANDATORY_SUCCESS
    )
    unsupported = decide_for("TestX", "test_ops", op="sin", dtype="float16")
    assert unsupported is not None and unsupported.mode is Mode.SKIP
    assert "'sin' is not in global.supported_ops" in unsupported.reason
    # included by the test's edits although not globally supported, with its tags
    tanh = decide_for("TestX", "test_ops", op="tanh", dtype="float16")
    assert tanh is not None and tanh.mode is Mode.MANDATORY_SUCCESS and "act" in tanh.tags
    assert _mode(decide_for("TestX", "test_ops", op="sub", dtype="float16")) is Mode.SKIP
    forced = decide_for("TestX", "test_ops", op="mul", dtype="float16")
    assert (
        forced is not None
        and forced.mode is Mode.XFAIL
        and "op 'mul' has force_xfail" in forced.reason
    )
    # force_xfail never loosens a stricter mode
    assert _mode(decide_for("TestX", "test_exact", op="mul", dtype="float16")) is Mode.XFAIL_STRICT


def test_dtype_force_xfail_and_op_dtypes(decide_for: Callable[..., Decision | None]) -> None:
    assert _mode(decide_for("TestX", "test_bare", dtype="bfloat16")) is Mode.XFAIL
    assert _mode(decide_for("TestX", "test_ops", op="add", dtype="int8")) is Mode.XFAIL
    # div only supports float16 (with its own precision, which wins over the global one)
    div16 = decide_for("TestX", "test_bare", op="div", dtype="float16")
    assert div16 is not None and div16.precision is not None and div16.precision.atol == 0.1
    div32 = decide_for("TestX", "test_bare", op="div", dtype="float32")
    assert div32 is not None and div32.mode is Mode.SKIP and "op 'div'" in div32.reason
    plain16 = decide_for("TestX", "test_bare", dtype="float16")
    assert plain16 is not None and plain16.precision is not None
    assert (plain16.precision.atol, plain16.precision.rtol) == (0.01, 0.02)


def test_labels(decide_for: Callable[..., Decision | None]) -> None:
    assert _mode(decide_for("TestX", "test_nightly", label="nightly")) is Mode.MANDATORY_SUCCESS
    trunk = decide_for("TestX", "test_nightly", label="trunk")
    assert trunk is not None and trunk.mode is Mode.SKIP and "label 'trunk'" in trunk.reason
    # other entries inherit the file's labels (the suite's [trunk])
    assert _mode(decide_for("TestX", "test_bare", label="trunk")) is Mode.MANDATORY_SUCCESS
    assert _mode(decide_for("TestX", "test_bare", label="nightly")) is Mode.SKIP


def test_modules_filter_like_ops(decide_for: Callable[..., Decision | None]) -> None:
    # ModuleInfo names come without the torch. prefix; specs may use either spelling
    assert (
        _mode(decide_for("TestX", "test_modules", module="torch.nn.Linear", dtype="float32"))
        is Mode.MANDATORY_SUCCESS
    )
    assert (
        _mode(decide_for("TestX", "test_bare", module="torch.nn.ReLU", dtype="float32"))
        is Mode.XFAIL
    )
    unsupported = decide_for("TestX", "test_bare", module="torch.nn.LSTM", dtype="float32")
    assert (
        unsupported is not None
        and "'nn.LSTM' is not in global.supported_modules" in unsupported.reason
    )
    assert (
        _mode(decide_for("TestX", "test_modules", module="torch.nn.GELU", dtype="float32"))
        is Mode.MANDATORY_SUCCESS
    )
    excluded = decide_for("TestX", "test_modules", module="torch.nn.Conv2d", dtype="float32")
    assert (
        excluded is not None and excluded.mode is Mode.SKIP and "edits.modules" in excluded.reason
    )
    conv16 = decide_for("TestX", "test_bare", module="torch.nn.Conv2d", dtype="float16")
    assert conv16 is not None and conv16.mode is Mode.SKIP and "module 'nn.Conv2d'" in conv16.reason
