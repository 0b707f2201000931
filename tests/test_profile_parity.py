"""``ci-relay specs profile-check``: the spyre-emu profile against what specs say the card
supports, with each op traced to the aten overloads it reaches."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from spyre_emu.profile import DEFAULT_PROFILE_FILE, load_profile_file
from spyre_emu.spec_parity import Finding, check_profile_parity, trace_op
from tests.conftest import CliResult

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BUNDLED_SPECS = Path(__file__).resolve().parents[1] / "reuse_specs" / "specs"
BUNDLED_PROFILE = DEFAULT_PROFILE_FILE


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def _spec(tmp_path: Path, global_yaml: str, tests_yaml: str = "") -> Path:
    body = textwrap.indent(textwrap.dedent(global_yaml).strip("\n"), "    ")
    tests = textwrap.indent(textwrap.dedent(tests_yaml).strip("\n"), "      ")
    return _write(
        tmp_path / "spec.yaml",
        "test_suite_config:\n"
        "  files:\n"
        "    - path: ${TORCH_ROOT}/test/test_x.py\n"
        + (f"      tests:\n{tests}\n" if tests else "")
        + f"  global:\n{body}\n",
    )


def _profile(tmp_path: Path, text: str) -> Path:
    return _write(tmp_path / "profile.yaml", text)


def _check(spec: Path, profile: Path) -> list[Finding]:
    return check_profile_parity([spec], load_profile_file(profile), str(profile)).findings


def _only(findings: list[Finding], severity: str) -> list[str]:
    return [f"{f.location}: {f.message}" for f in findings if f.severity == severity]


def test_the_bundled_profile_agrees_with_the_bundled_specs(
    cli: Callable[..., CliResult],
) -> None:
    """The pair shipped together: no error, no warning (a spec or profile edit that breaks
    the agreement fails here)."""
    for folder in (BUNDLED_SPECS, BUNDLED_SPECS / "pytorch"):
        result = cli("specs", "profile-check", folder, "--profile", BUNDLED_PROFILE, "--strict")
        assert result.code == 0, result.output
        assert "0 error(s), 0 warning(s)" in result.output


def test_a_dtype_the_spec_supports_but_the_profile_refuses_is_an_error(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    spec = _spec(tmp_path, "supported_dtypes: [{name: float16}, {name: float32}]")
    profile = _profile(tmp_path, "name: no-half\ndtypes: [float32, int64, bool]\n")
    result = cli("specs", "profile-check", spec, "--profile", profile)
    assert result.code == 1, result.output
    assert "spec.yaml:5:24" in result.output  # the float16 item
    assert "supports float16 but profile 'no-half' refuses" in result.output
    assert "MISMATCH" in result.output


def test_a_compute_dtype_no_spec_lists_is_an_error_but_indices_and_masks_are_not(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path, "supported_dtypes: [{name: float16}]")
    profile = _profile(tmp_path, "dtypes: [float16, bfloat16, int64, bool]\n")
    errors = _only(_check(spec, profile), "error")
    assert len(errors) == 1, errors
    assert "accepts bfloat16, which no spec's global.supported_dtypes lists" in errors[0]
    assert errors[0].startswith(str(profile))


def test_an_op_whose_aten_kernel_the_profile_refuses_is_an_error_at_its_line(
    tmp_path: Path,
) -> None:
    spec = _spec(
        tmp_path,
        """
        supported_dtypes: [{name: float32}, {name: float16}, {name: bfloat16}]
        supported_ops:
          - abs
          - exp
        """,
    )
    refusing = _profile(tmp_path, "unsupported_ops: [exp]\n")
    errors = _only(_check(spec, refusing), "error")
    assert len(errors) == 1, errors
    assert "spec.yaml:8:9" in errors[0] and "op 'exp' reaches aten::exp.default" in errors[0]
    # the same spec against a profile that runs exp: nothing to say
    allowing = _write(tmp_path / "ok.yaml", "unsupported_ops: []\n")
    assert _check(spec, allowing) == []


def test_force_xfail_that_the_emulator_runs_anyway_is_a_warning(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    spec = _spec(
        tmp_path,
        """
        supported_dtypes: [{name: float32}, {name: float16}, {name: bfloat16}]
        supported_ops: [{name: neg, force_xfail: true}]
        """,
    )
    profile = _profile(tmp_path, "unsupported_ops: []\n")
    lenient = cli("specs", "profile-check", spec, "--profile", profile)
    assert lenient.code == 0, lenient.output
    assert "op 'neg' has force_xfail" in lenient.output
    assert "aten::neg.default" in lenient.output
    strict = cli("specs", "profile-check", spec, "--profile", profile, "--strict")
    assert strict.code == 1
    # once the profile refuses neg, spec and emulator agree
    _profile(tmp_path, "unsupported_ops: [neg]\n")
    assert _check(spec, profile) == []


def test_names_that_resolve_to_nothing_are_warnings_that_say_what_was_tried(
    tmp_path: Path,
) -> None:
    spec = _spec(
        tmp_path,
        """
        supported_ops: [no_such_op]
        supported_modules: [torch.nn.NoSuchModule]
        """,
        """
        - names: [TestX::test_y]
          edits: {ops: {include: [{name: tanh}, {name: not_an_op}, {name: gelu}]}}
        """,
    )
    findings = _check(spec, _profile(tmp_path, "{}\n"))
    assert _only(findings, "error") == []
    warnings = _only(findings, "warning")
    assert len(warnings) == 4, warnings
    assert any(
        "supported_ops lists 'no_such_op', which names no OpInfo, aten op or known card kernel" in w
        and "tried OpInfo no_such_op, nn.functional.no_such_op" in w
        for w in warnings
    )
    assert any("supported_modules lists 'torch.nn.NoSuchModule'" in w for w in warnings)
    assert any("edits.ops.include lists 'not_an_op'" in w for w in warnings)
    # a short name resolves, but includes take the full name: say which
    assert any("(write 'nn.functional.gelu')" in w for w in warnings)


def test_included_ops_and_modules_are_traced_too(tmp_path: Path) -> None:
    spec = _spec(
        tmp_path,
        """
        supported_dtypes: [{name: float32}, {name: float16}, {name: bfloat16}]
        supported_modules: [torch.nn.Linear]
        """,
        """
        - names: [TestX::test_y]
          edits: {ops: {include: [{name: tanh}]}}
        """,
    )
    profile = _profile(tmp_path, "unsupported_ops: [tanh, addmm, mm]\n")
    errors = _only(_check(spec, profile), "error")
    assert len(errors) == 2, errors
    assert any("included op 'tanh' reaches aten::tanh.default" in e for e in errors)
    assert any("module 'nn.Linear' reaches aten::addmm.default" in e for e in errors)


def test_tracing_sees_what_the_device_sees_after_decomposition() -> None:
    """``linalg.norm`` is a composite: the device gets ``linalg_vector_norm``, which is the
    name a profile has to refuse."""
    from torch.testing._internal.common_methods_invocations import op_db

    norm = next(o for o in op_db if o.full_name == "linalg.norm")
    trace = trace_op(norm, [torch.float32])
    names = {o._schema.name for o in trace.aten}
    assert trace.problem is None and trace.dtype is torch.float32
    assert "aten::linalg_vector_norm" in names and "aten::linalg_norm" not in names
    # an op with no dtype in common is reported, not traced
    untraced = trace_op(norm, [torch.bool])
    assert untraced.aten == () and "no dtype the spec gives (bool)" in (untraced.problem or "")


def test_bad_input_is_a_clear_error(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    spec = _spec(tmp_path, "supported_ops: [abs]")
    bad_profile = _profile(tmp_path, "dtypes: [float16]\nwhat: 1\n")
    result = cli("specs", "profile-check", spec, "--profile", bad_profile)
    assert result.code == 2 and "unknown key(s) ['what']" in result.output
    broken = _write(tmp_path / "broken.yaml", "test_suite_config: {files: 3}\n")
    result = cli("specs", "profile-check", broken, "--profile", bad_profile)
    assert result.code == 2 and "nothing was compared" in result.output


def test_an_op_that_makes_a_dtype_the_profile_lacks_is_an_error(tmp_path: Path) -> None:
    """``frexp`` returns an int32 exponent: on the device that tensor cannot exist."""
    spec = _spec(
        tmp_path,
        """
        supported_dtypes: [{name: float32}, {name: float16}]
        supported_ops: [frexp]
        """,
    )
    card = _profile(tmp_path, "dtypes: [float16, float32, int64, bool]\n")
    errors = _only(_check(spec, card), "error")
    assert len(errors) == 1 and "op 'frexp' reaches dtype int32" in errors[0], errors
    with_int32 = _profile(tmp_path, "dtypes: [float16, float32, int64, bool, int32]\n")
    errors = _only(_check(spec, with_int32), "error")
    # frexp is fine now; what is left is that no spec says the card computes in int32
    assert len(errors) == 1 and "accepts int32, which no spec" in errors[0], errors


def test_the_profile_comes_from_the_emulators_own_variable(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """Without --profile, SPYRE_EMU_PROFILE as the emulator reads it: "default" (or unset) is
    the bundled default, a path is that file."""
    result = cli(
        "specs", "profile-check", BUNDLED_SPECS, "--strict", env={"SPYRE_EMU_PROFILE": "default"}
    )
    assert result.code == 0, result.output
    assert f"profile 'torch-spyre-published' ({DEFAULT_PROFILE_FILE})" in result.output
    no_sqrt = _profile(tmp_path, "name: no-sqrt\nunsupported_ops: [sqrt]\n")
    refused = cli("specs", "profile-check", BUNDLED_SPECS, env={"SPYRE_EMU_PROFILE": str(no_sqrt)})
    assert refused.code == 1, refused.output
    assert "op 'sqrt' reaches aten::sqrt.default" in refused.output
    assert f"profile 'no-sqrt' ({no_sqrt})" in refused.output
    missing = cli(
        "specs", "profile-check", BUNDLED_SPECS, env={"SPYRE_EMU_PROFILE": str(tmp_path / "no")}
    )
    assert missing.code == 2 and "cannot read the profile" in missing.output
