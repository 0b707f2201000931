"""The emulated card follows torch-spyre's published support list (issue 26): the default
profile is generated from the list, every kind of op name in it resolves, and the list checks
clean against the default profile. (That reuse_specs never imports the emulator is a rule of
tests/test_layers.py.)"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from reuse_specs import load_specs
from reuse_specs.matching import TestVariant, decide
from spyre_emu.errors import ProfileError
from spyre_emu.op_names import AtenName, OpNames, Unresolved, read_kernel_aliases
from spyre_emu.profile import (
    DEFAULT_PROFILE,
    DEFAULT_PROFILE_FILE,
    NO_KERNEL_FAMILIES,
    load_profile_file,
)
from tests.conftest import CliResult

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPO_ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = REPO_ROOT / "spyre_emu" / "published" / "nn-test_init.yaml"  # SOURCE.md there


@pytest.fixture(scope="module")
def published() -> Path:
    if not PUBLISHED.is_file():
        pytest.fail(f"{PUBLISHED} is missing: it is tracked in the repository")
    return PUBLISHED


@pytest.fixture(scope="module")
def names() -> OpNames:
    from spyre_emu.op_names import op_names

    return op_names()


def test_the_default_profile_is_the_published_list_regenerated(
    published: Path, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """The bundled default is exactly what `specs profile-from` writes from the copy
    of the list (the README's regeneration command), and it records that source."""
    recorded = dict(DEFAULT_PROFILE.source)
    assert recorded["spec"] == "nn-test_init.yaml"
    assert recorded["sha256"] == hashlib.sha256(published.read_bytes()).hexdigest()
    assert recorded["origin"].startswith("torch-spyre/torch-spyre@6379004f")
    out = tmp_path / "regenerated.yaml"
    result = cli(
        "specs", "profile-from", published, "--name", DEFAULT_PROFILE.name,
        "--origin", recorded["origin"], "-o", out,
    )  # fmt: skip
    assert result.code == 0, result.output
    assert out.read_text() == DEFAULT_PROFILE_FILE.read_text()
    listed = yaml.safe_load(published.read_text())["test_suite_config"]["global"]
    assert {d.removeprefix("torch.") for d in map(str, DEFAULT_PROFILE.dtypes)} == {
        d["name"] for d in listed["supported_dtypes"]
    }
    assert torch.bfloat16 in DEFAULT_PROFILE.dtypes and torch.float64 not in DEFAULT_PROFILE.dtypes
    assert DEFAULT_PROFILE.unsupported_ops == NO_KERNEL_FAMILIES  # the list forces no op


def test_the_published_list_checks_clean_against_the_default_profile(
    published: Path, cli: Callable[..., CliResult]
) -> None:
    """0 errors on the team's own list; the one warning left is the kernel whose aten
    counterpart is not published (exx2), and it says what was tried."""
    result = cli("specs", "profile-check", published, env={"SPYRE_EMU_PROFILE": ""})
    assert result.code == 0, result.output
    assert "0 error(s), 1 warning(s)" in result.output
    (warning,) = [line for line in result.stdout.splitlines() if ": warning: " in line]
    assert "'exx2'" in warning and "tried OpInfo exx2, nn.functional.exx2" in warning
    assert "aten::exx2" in warning and "kernel_aliases.yaml" in warning
    assert "not in PyTorch's OpInfo" not in result.output
    for kernel, aten in [("realdiv", "aten::div.Tensor"), ("topkindex", "aten::topk")]:
        assert f"op '{kernel}' (the card's kernel for {aten}" in result.stdout
    strict = cli("specs", "profile-check", published, "--strict", env={"SPYRE_EMU_PROFILE": ""})
    assert strict.code == 1 and "MISMATCH" in strict.output


def test_every_kind_of_name_resolves(names: OpNames) -> None:
    def how(name: str) -> tuple[str, str]:
        resolved = names.resolve(name)
        return type(resolved).__name__, resolved.how

    assert how("add") == ("OpInfoName", "OpInfo add")
    assert how("softplus") == ("OpInfoName", "OpInfo nn.functional.softplus")
    assert how("F.gelu") == ("OpInfoName", "OpInfo nn.functional.gelu")
    assert how("rms_norm") == ("OpInfoName", "OpInfo nn.functional.rms_norm")
    assert how("_refs.add") == ("OpInfoName", "OpInfo _refs.add")
    assert how("_scaled_mm") == ("OpInfoName", "OpInfo torch._scaled_mm")
    assert how("max.reduction_with_dim") == ("OpInfoName", "OpInfo max.reduction_with_dim")
    assert how("convolution") == ("AtenName", "aten op aten::convolution")
    assert how("aten::div.Tensor_mode") == ("AtenName", "aten op aten::div.Tensor_mode")
    assert how("aten.add.Tensor")[0] == "AtenName"
    kind, text = how("realdiv")
    assert kind == "AtenName" and "the card's kernel for aten::div.Tensor, aten::div.Scalar" in text
    for unknown in ("exx2", "div.no_such_overload", "nn", ""):
        resolved = names.resolve(unknown)
        assert isinstance(resolved, Unresolved), unknown
        assert "aten::" in resolved.how and "kernel_aliases.yaml" in resolved.how
    # includes take one variant by its full name
    (only,) = names.resolve("max.binary", variant=True).opinfos  # type: ignore[union-attr]
    assert only.full_name == "max.binary"


def test_the_kernel_alias_table_is_checked(tmp_path: Path) -> None:
    table = read_kernel_aliases()
    assert table["realdiv"].aten == ("div.Tensor", "div.Scalar") and table["realdiv"].why
    assert "exx2" not in table  # not published: a warning, not a guess
    bad = tmp_path / "aliases.yaml"
    bad.write_text("relufwd: {aten: relu}\n")
    with pytest.raises(ValueError, match="'relufwd' needs exactly"):
        read_kernel_aliases(bad)
    bad.write_text("relufwd: {aten: [relu, no_such_op.Tensor], why: a typo}\n")
    with pytest.raises(ValueError, match=r"'relufwd' maps to aten::no_such_op.Tensor, which torch"):
        read_kernel_aliases(bad)
    names = OpNames([], {"mykernel": read_kernel_aliases()["relufwd"]})
    assert isinstance(names.resolve("mykernel"), AtenName)
    assert isinstance(names.resolve("add"), AtenName)  # no OpInfo database: aten answers


def test_a_kernel_or_aten_name_the_profile_refuses_is_an_error(
    tmp_path: Path, cli: Callable[..., CliResult], write_spec: Callable[..., Path]
) -> None:
    spec = write_spec(
        """
        test_suite_config:
          files:
            - path: ${TORCH_ROOT}/test/test_x.py
          global:
            supported_dtypes: [{name: float16}]
            supported_ops: [realdiv, convolution, {name: relufwd, force_xfail: true}]
        """
    )
    profile = tmp_path / "profile.yaml"
    profile.write_text("dtypes: [float16, int64, bool]\nunsupported_ops: [div, convolution]\n")
    result = cli("specs", "profile-check", spec, "--profile", profile)
    assert result.code == 1
    errors = [line for line in result.stdout.splitlines() if ": error: " in line]
    assert len(errors) == 2, result.output
    assert "op 'realdiv' (the card's kernel for aten::div.Tensor" in errors[0]
    assert "refuses aten::div.Scalar, aten::div.Tensor" in errors[0]
    assert "op 'convolution' (aten op aten::convolution)" in errors[1]
    # the profile runs relu, which the spec says the card refuses: may XPASS
    assert "op 'relufwd' (the card's kernel for aten::relu" in result.stdout
    assert "has force_xfail but profile" in result.stdout


def test_a_short_name_in_the_spec_decides_the_opinfo_variants(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """`softplus` in global.supported_ops covers OpInfo `nn.functional.softplus`, as the
    check resolves it; an entry naming the full form exactly wins over a short one."""
    (tmp_path / "test").mkdir()
    test_file = tmp_path / "test" / "test_x.py"
    test_file.write_text("# placeholder\n")
    spec = load_specs(
        [
            write_spec(
                """
                test_suite_config:
                  files:
                    - path: ${TORCH_ROOT}/test/test_x.py
                      unlisted_test_mode: mandatory_success
                  global:
                    supported_dtypes: [{name: float16}]
                    supported_ops:
                      - softplus
                      - {name: gelu, force_xfail: true}
                      - nn.functional.gelu
                """
            )
        ],
        tmp_path,
    )

    def decision(op: str) -> str:
        made = decide(spec, TestVariant(test_file, "TestX", "test_y", op=op, dtype="float16"))
        assert made is not None
        return f"{made.mode.value}: {made.reason}"

    assert decision("nn.functional.softplus").startswith("mandatory_success")
    assert decision("nn.functional.gelu").startswith("mandatory_success")  # exact entry
    assert "not in global.supported_ops" in decision("nn.functional.silu")


def test_profile_from_refuses_force_xfail_ops_and_keeps_what_the_list_supports(
    tmp_path: Path, cli: Callable[..., CliResult], write_spec: Callable[..., Path]
) -> None:
    spec = write_spec(
        """
        test_suite_config:
          files:
            - path: ${TORCH_ROOT}/test/test_x.py
          global:
            supported_dtypes: [{name: float32}, {name: float16}, {name: int8, force_xfail: true}]
            supported_ops:
              - {name: div, force_xfail: true}
              - {name: mul, dtypes: [{name: bfloat16}]}
              - linalg_qr
        """,
        "card.yaml",
    )
    out = tmp_path / "profile.yaml"
    result = cli("specs", "profile-from", spec, "-o", out, "--origin", "example@1 card.yaml")
    assert result.code == 0, result.output
    assert "'linalg_qr' is not refused: the list supports linalg_qr" in result.stderr
    profile = load_profile_file(out)
    assert profile.name == "card-published"
    assert [str(d) for d in profile.dtypes] == [
        "torch.float16", "torch.float32", "torch.bfloat16", "torch.int64", "torch.bool",
    ]  # fmt: skip
    assert not profile.allows_op("aten::div", "Tensor")  # force_xfail: the card refuses it
    assert profile.allows_op("aten::linalg_qr", "default")  # a no-kernel family it lists
    assert not profile.allows_op("aten::_fft_r2c", "default")
    assert dict(profile.source)["origin"] == "example@1 card.yaml"
    assert "# Generated by `ci-relay specs profile-from`" in out.read_text()
    # nothing to take the card's dtypes from: a clear error, nothing written
    bare = tmp_path / "bare.yaml"
    bare.write_text("test_suite_config:\n  files:\n    - path: ${TORCH_ROOT}/test/test_x.py\n")
    result = cli("specs", "profile-from", bare, "-o", tmp_path / "none.yaml")
    assert result.code == 2 and "lists no supported_dtypes" in result.output
    assert not (tmp_path / "none.yaml").exists()


def test_a_profile_source_must_be_text(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("source: [not, a, mapping]\n")
    with pytest.raises(ProfileError, match="source is a mapping of names to text"):
        load_profile_file(path)


def test_the_emulator_runs_bfloat16_and_true_division_as_the_list_says(tmp_path: Path) -> None:
    """The default profile in a fresh process: bfloat16 tensors and div run on the device
    (torch-spyre lists both); float64 is still refused (the list does not have it)."""
    code = textwrap.dedent(
        """
        import torch, spyre_emu
        print(spyre_emu.load().name)
        x = torch.tensor([1.0, 2.0], dtype=torch.bfloat16, device="spyre")
        print((x / x).cpu().tolist(), (x / x).dtype, (x / x).device)
        try:
            torch.zeros(2, dtype=torch.float64, device="spyre")
        except Exception as exc:
            print(type(exc).__name__)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "SPYRE_EMU_PROFILE"}
    env["SPYRE_EMU_LOCK_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "torch-spyre-published",
        "[1.0, 1.0] torch.bfloat16 spyre:0",
        "UnsupportedDtypeError",
    ]
