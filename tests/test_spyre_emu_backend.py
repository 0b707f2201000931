"""The spyre-emu backend end to end: the sample upstream's device-generic and OpInfo tests
instantiated for the emulated card, outcomes decided by the bundled specs and the device."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from ci_relay.sample_upstream import SampleUpstream
from tests.conftest import BUNDLED_SPECS, CliResult

BINARY = BUNDLED_SPECS / "spyre_binary_ufuncs.yaml"


def _cases(junit: Path) -> dict[str, tuple[str, str, str]]:
    """name -> (class, result, message) from a JUnit file."""
    out = {}
    for case in ET.parse(junit).iter("testcase"):
        verdict = [c for c in case if c.tag in ("failure", "error", "skipped")]
        result = verdict[0].tag if verdict else "passed"
        message = (verdict[0].get("message") or "") + (verdict[0].text or "") if verdict else ""
        out[case.get("name", "")] = (case.get("classname", "").rsplit(".", 1)[-1], result, message)
    return out


@pytest.fixture(scope="module")
def binary_run(
    sample_upstream: SampleUpstream, tmp_path_factory: pytest.TempPathFactory
) -> tuple[CliResult, dict[str, tuple[str, str, str]]]:
    import os
    import subprocess
    import sys

    work = tmp_path_factory.mktemp("spyre-emu-binary")
    junit = work / "junit.xml"
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_ROOT", "SPYRE_EMU_PROFILE")}
    proc = subprocess.run(
        [sys.executable, "-m", "ci_relay", "run", "--spec", str(BINARY), "--upstream",
         str(sample_upstream.path), "--backend", "spyre-emu", "--junit", str(junit)],
        capture_output=True, text=True, env={**env, "COLUMNS": "200"}, cwd=work, timeout=600,
        check=False,
    )  # fmt: skip
    return CliResult(proc.returncode, proc.stdout, proc.stderr), _cases(junit)


def test_every_variant_is_instantiated_for_the_spyre_device(
    binary_run: tuple[CliResult, dict[str, tuple[str, str, str]]],
) -> None:
    result, cases = binary_run
    assert result.code == 0, result.output
    assert len(cases) > 30
    assert {cls for cls, _, _ in cases.values()} == {"TestBinaryUfuncsSPYRE"}
    assert all("_spyre" in name for name in cases), sorted(cases)
    assert cases["test_add_spyre_float16"][1] == "passed"  # device-generic, @dtypes
    assert cases["test_contig_vs_transposed_mul_spyre_float16"][1] == "passed"  # OpInfo @ops


def test_dtypes_outside_the_spec_are_not_run(
    binary_run: tuple[CliResult, dict[str, tuple[str, str, str]]],
) -> None:
    _, cases = binary_run
    float64 = {n: c for n, c in cases.items() if n.endswith("_float64")}
    assert float64 and all(r == "skipped" for _, r, _ in float64.values())
    assert "not in global.supported_dtypes" in cases["test_add_spyre_float64"][2]


def test_ops_the_emulated_card_rejects_are_expected_failures(
    binary_run: tuple[CliResult, dict[str, tuple[str, str, str]]],
    sample_upstream: SampleUpstream,
    cli: Callable[..., CliResult],
    tmp_path: Path,
) -> None:
    """div runs on the default profile (torch-spyre's list has true division, kernel
    realdiv), so its variants pass. On a card profile without div, a spec that marks div
    force_xfail gets expected failures, and without force_xfail the same variants fail with
    the device's missing-kernel error (so the xfail is the device's doing, not a pass in
    disguise)."""
    _, cases = binary_run
    div = sorted(  # the OpInfo variants of div; test_div_rounding_modes is skipped by name
        n for n in cases if "_div_" in n and "rounding_modes" not in n and "float64" not in n
    )
    assert div and {cases[n][1] for n in div} == {"passed"}
    no_div = tmp_path / "no-div.yaml"
    no_div.write_text("name: no-div\nunsupported_ops: [div]\n")
    forced = tmp_path / "forced.yaml"
    forced.write_text(
        BINARY.read_text().replace("      - div  #", "      - {name: div, force_xfail: true}  #")
    )
    tests = tmp_path / "tests.txt"
    tests.write_text("test/test_binary_ufuncs.py::TestBinaryUfuncs::test_contig_vs_transposed\n")
    contig_div = [n for n in div if n.startswith("test_contig_vs_transposed_div")]
    outcomes = {}
    for spec in (forced, BINARY):
        junit = tmp_path / f"{spec.stem}.xml"
        result = cli(
            "run", "--spec", spec, "--upstream", sample_upstream.path, "--backend", "spyre-emu",
            "--tests", tests, "--junit", junit, env={"SPYRE_EMU_PROFILE": str(no_div)},
        )  # fmt: skip
        outcomes[spec.stem] = (result.code, _cases(junit))
    code, expected = outcomes["forced"]
    assert code == 0 and {expected[n][1] for n in contig_div} == {"skipped"}  # pytest's xfail
    assert all("force_xfail" in expected[n][2] for n in contig_div)
    code, unforced = outcomes[BINARY.stem]
    assert code == 1
    failed = {n: c for n, c in unforced.items() if c[1] == "failure"}
    assert sorted(failed) == contig_div
    for _, _, message in failed.values():
        assert "Could not run 'aten::div" in message and "'spyre' backend" in message


def test_a_dtype_the_card_lacks_fails_loudly(
    binary_run: tuple[CliResult, dict[str, tuple[str, str, str]]],
    sample_upstream: SampleUpstream,
    cli: Callable[..., CliResult],
    write_spec: Callable[..., Path],
    tmp_path: Path,
) -> None:
    _, cases = binary_run
    assert cases["test_type_promotion_spyre"][1] == "skipped"  # the bundled spec: xfail
    must_pass = write_spec(
        """
        test_suite_config:
          files:
            - path: ${TORCH_ROOT}/test/test_binary_ufuncs.py
              unlisted_test_mode: skip
              tests:
                - names: [TestBinaryUfuncs::test_type_promotion]
        """
    )
    junit = tmp_path / "junit.xml"
    result = cli(
        "run", "--spec", must_pass, "--upstream", sample_upstream.path,
        "--backend", "spyre-emu", "--junit", junit,
    )  # fmt: skip
    assert result.code == 1
    _, outcome, message = _cases(junit)["test_type_promotion_spyre"]
    assert outcome == "failure"
    assert "dtype int32 is not supported on spyre:0" in message


def test_the_spec_precision_decides_a_float16_comparison(
    sample_upstream: SampleUpstream, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """prod in float16 needs the spec's looser tolerance on the card: with it the variant
    passes, without it the same variant fails (so the override really reaches assertEqual)."""
    loose, strict = tmp_path / "loose.xml", tmp_path / "strict.xml"
    no_precision = tmp_path / "spec.yaml"
    no_precision.write_text(
        BINARY.read_text().replace("precision: {atol: 1.0e-2, rtol: 1.0e-2}", "")
    )
    tests = tmp_path / "tests.txt"
    tests.write_text("test/test_binary_ufuncs.py::TestBinaryUfuncs::test_prod_reference\n")
    for spec, junit in ((BINARY, loose), (no_precision, strict)):
        cli(
            "run", "--spec", spec, "--upstream", sample_upstream.path, "--backend", "spyre-emu",
            "--junit", junit, "--tests", tests,
        )  # fmt: skip
    assert _cases(loose)["test_prod_reference_spyre_float16"][1] == "passed"
    assert _cases(strict)["test_prod_reference_spyre_float16"][1] == "failure"


def test_the_real_card_backend_refuses_clearly_without_torch_spyre(
    sample_upstream: SampleUpstream, cli: Callable[..., CliResult]
) -> None:
    result = cli("run", "--spec", BINARY, "--upstream", sample_upstream.path, "--backend", "spyre")
    assert result.code == 2
    assert "needs torch-spyre installed" in result.stderr
    assert "--backend spyre-emu" in result.stderr


@pytest.mark.container
@pytest.mark.slow
def test_the_spyre_emu_runner_image_runs_them_in_a_container(
    sample_upstream: SampleUpstream, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    tests = tmp_path / "tests.txt"
    tests.write_text(
        "test/test_binary_ufuncs.py::TestBinaryUfuncs::test_add\n"
        "test/test_binary_ufuncs.py::TestBinaryUfuncs::test_contig_vs_transposed\n"
    )
    result = cli(
        "run", "--spec", BINARY, "--upstream", sample_upstream.path, "--backend", "spyre-emu",
        "--runtime", "container", "--tests", tests, "--junit", junit,
    )  # fmt: skip
    assert result.code == 0, result.output
    cases = _cases(junit)
    assert cases["test_add_spyre_float16"][1] == "passed"
    assert cases["test_contig_vs_transposed_div_no_rounding_mode_spyre_float16"][1] == "passed"
    assert "container: 1 process(es)" in result.stdout
