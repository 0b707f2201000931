"""``ci-relay specs check`` and ``run`` on bad input, through the real command line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ci_relay.sample_upstream import SampleUpstream
from tests.conftest import BUNDLED_SPECS, CliResult

DATA = Path(__file__).parent / "data"

MARKER_TEST = """
import pathlib

def test_writes_marker():
    pathlib.Path(__file__).with_name("ran.marker").write_text("ran")
"""


def _spec_for(path_line: str, extra: str = "") -> str:
    return f"""
    test_suite_config:
      files:
        - path: {path_line}
          tests:
            - names: [test_writes_marker]
    {extra}"""


BAD_INPUTS: dict[str, tuple[str | bytes, str, str]] = {
    # name: (spec text or bytes, expected location, expected message part)
    "missing file": (_spec_for("${TORCH_ROOT}/test/test_gone.py"), "3:13", "no such file"),
    "glob matching nothing": (
        _spec_for("${TORCH_ROOT}/test/test_nothing_*.py"),
        "3:13",
        "glob matches no file",
    ),
    "unknown mode": (
        _spec_for("${TORCH_ROOT}/test/test_m.py").replace(
            "names: [test_writes_marker]",
            "names: [test_writes_marker]\n              mode: must_pass",
        ),
        "6:17",
        "unknown mode 'must_pass'",
    ),
    "unknown dtype": (
        _spec_for(
            "${TORCH_ROOT}/test/test_m.py", "  global: {supported_dtypes: [{name: float17}]}"
        ),
        "6:38",
        "unknown dtype 'float17'",
    ),
    "conflicting duplicate names": (
        _spec_for("${TORCH_ROOT}/test/test_m.py").replace(
            "names: [test_writes_marker]",
            "names: [test_writes_marker]\n              mode: skip\n"
            "            - names: [test_writes_marker]\n              mode: xfail",
        ),
        "7:19",
        "'test_writes_marker' is listed with mode xfail here but skip at",
    ),
    "anchor bomb": (
        "x0: &x0 [a, a, a, a, a, a, a, a, a, a]\n"
        + "".join(f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 10)}]\n" for i in range(1, 8))
        + "test_suite_config: {files: []}\n",
        "",
        "alias bomb",
    ),
    "python tag": (
        "test_suite_config: !!python/object/apply:os.system ['touch pwned']\n",
        "1:20",
        "python/object/apply:os.system",
    ),
    "non-UTF-8 file": (
        "test_suite_config:\n  labels: [caf\xe9]\n".encode("latin-1"),
        "2:15",
        "not valid UTF-8",
    ),
}


@pytest.fixture
def marker_upstream(tiny_upstream: Callable[[dict[str, str]], Path]) -> Path:
    return tiny_upstream({"test/test_m.py": MARKER_TEST})


def _write(tmp_path: Path, content: str | bytes) -> Path:
    import textwrap

    spec = tmp_path / "bad.yaml"
    if isinstance(content, bytes):
        spec.write_bytes(content)
    else:
        spec.write_text(textwrap.dedent(content).lstrip("\n"), encoding="utf-8")
    return spec


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_check_rejects_bad_input_with_location(
    case: str, cli: Callable[..., CliResult], tmp_path: Path, marker_upstream: Path
) -> None:
    content, where, message = BAD_INPUTS[case]
    spec = _write(tmp_path, content)
    result = cli("specs", "check", spec, "--upstream", marker_upstream)
    assert result.code == 1, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith(str(spec))]
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"{spec}:{where}" if where else f"{spec}:"), lines[0]
    assert ": error: " in lines[0] and message in lines[0]
    assert not (tmp_path / "pwned").exists()


# what upstream can take away (a file, every file a glob matched) is drift for `run`, not bad
# input: `specs check` refuses it (above), `run` says so and runs what is left
DRIFT = {"missing file", "glob matching nothing"}


@pytest.mark.parametrize("case", sorted(set(BAD_INPUTS) - DRIFT))
def test_run_refuses_bad_input_and_runs_nothing(
    case: str, cli: Callable[..., CliResult], tmp_path: Path, marker_upstream: Path
) -> None:
    content, _where, message = BAD_INPUTS[case]
    spec = _write(tmp_path, content)
    junit = tmp_path / "junit.xml"
    result = cli("run", "--spec", spec, "--upstream", marker_upstream, "--junit", junit)
    assert result.code == 2, result.output
    assert message in result.stdout
    assert "nothing was run" in result.stderr
    assert not junit.exists()
    assert not (marker_upstream / "test" / "ran.marker").exists()


@pytest.mark.parametrize("case", sorted(DRIFT))
def test_run_of_a_spec_whose_only_file_vanished_runs_nothing_and_says_why(
    case: str, cli: Callable[..., CliResult], tmp_path: Path, marker_upstream: Path
) -> None:
    content, _where, message = BAD_INPUTS[case]
    spec = _write(tmp_path, content)
    result = cli("run", "--spec", spec, "--upstream", marker_upstream)
    assert result.code == 4, result.output  # nothing selected, not bad input
    assert "spec drift: 1 listed name(s) or path(s)" in result.stderr
    assert message in result.stderr
    assert "none of the files the spec lists exists at this upstream revision" in result.stderr
    assert not (marker_upstream / "test" / "ran.marker").exists()


DRIFTING_UPSTREAM = {
    "test/test_m.py": MARKER_TEST
    + """

class TestShapes:
    def test_reshape_alias(self):
        pass

    def test_flatten(self):
        pass


class TestMoved:
    def test_squeeze(self):
        pass
""",
    "test/test_views_renamed.py": "def test_nothing_here():\n    pass\n",
}

DRIFTING_SPEC = """
test_suite_config:
  files:
    # the marker file is still here; two of its listed names are not
    - path: ${TORCH_ROOT}/test/test_m.py
      tests:
        - names: [test_writes_marker]
        - names: [TestShapes::test_reshape_alias_copy]  # renamed upstream
        - names: [TestShapes::test_squeeze]  # moved to another class
    - path: ${TORCH_ROOT}/test/test_views_renamd.py  # the file moved
      tests:
        - names: [test_nothing_here]
"""


def test_spec_drift_never_blocks_a_run(
    cli: Callable[..., CliResult],
    write_spec: Callable[..., Path],
    tiny_upstream: Callable[[dict[str, str]], Path],
) -> None:
    """Names, paths that vanished upstream: reported with their likely new name, the rest
    runs; `specs check --upstream` stays strict about the same spec."""
    upstream = tiny_upstream(DRIFTING_UPSTREAM)
    spec = write_spec(DRIFTING_SPEC)
    result = cli("run", "--spec", spec, "--upstream", upstream)
    assert result.code == 0, result.output
    assert (upstream / "test" / "ran.marker").read_text() == "ran"
    summary = result.stdout[result.stdout.index("results by spec mode") :]
    assert "spec drift: 3 listed name(s) or path(s) not in this upstream revision" in summary
    assert (
        f"{spec}:7:19: 'TestShapes::test_reshape_alias_copy' is not a test in "
        f"{upstream / 'test' / 'test_m.py'}; likely renamed to 'TestShapes::test_reshape_alias'"
    ) in summary
    assert "'TestShapes::test_squeeze' is not a test" in summary
    assert "likely renamed to 'TestMoved::test_squeeze'" in summary
    assert (
        "no such file: ${TORCH_ROOT}/test/test_views_renamd.py; likely renamed to "
        "'${TORCH_ROOT}/test/test_views_renamed.py'"
    ) in summary

    strict = cli("specs", "check", spec, "--upstream", upstream)
    assert strict.code == 1, strict.output
    errors = [line for line in strict.stdout.splitlines() if ": error: " in line]
    assert len(errors) == 3, strict.output
    assert "likely renamed to 'TestShapes::test_reshape_alias'" in errors[0]


def test_control_a_valid_spec_does_run_the_marker_test(
    cli: Callable[..., CliResult], write_spec: Callable[..., Path], marker_upstream: Path
) -> None:
    spec = write_spec(_spec_for("${TORCH_ROOT}/test/test_m.py"))
    result = cli("run", "--spec", spec, "--upstream", marker_upstream)
    assert result.code == 0, result.output
    assert (marker_upstream / "test" / "ran.marker").read_text() == "ran"


def test_check_accepts_bundled_and_every_key_specs(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream
) -> None:
    structure = cli("specs", "check", BUNDLED_SPECS)
    assert structure.code == 0, structure.output
    assert "OK 4 spec file(s)" in structure.stdout and "structure only" in structure.stdout
    every_key = cli("specs", "check", DATA / "every_key.yaml", "--upstream", sample_upstream.path)
    assert every_key.code == 0, every_key.output
    assert "note: sample_inputs_func is accepted but not applied by ci-relay" in every_key.stdout
    full = cli("specs", "check", BUNDLED_SPECS, "--upstream", sample_upstream.path)
    assert full.code == 0, full.output
    assert f"against {sample_upstream.path}" in full.stdout


def test_check_uses_torch_root_and_reports_unknown_test_names(
    cli: Callable[..., CliResult], write_spec: Callable[..., Path], sample_upstream: SampleUpstream
) -> None:
    spec = write_spec(
        """
        test_suite_config:
          files:
            - path: ${TORCH_ROOT}/test/test_view_ops.py
              tests:
                - names: [TestViewOps::test_view_shares_storage, "TestViewOps::test_transpose_*"]
                - names: [TestViewOps::test_no_such_test, "TestNope::*"]
        """
    )
    result = cli("specs", "check", spec, env={"TORCH_ROOT": str(sample_upstream.path)})
    assert result.code == 1
    errors = result.stdout.splitlines()
    assert errors[0].startswith(
        f"{spec}:6:19: error: 'TestViewOps::test_no_such_test' is not a test in"
    )
    assert errors[1].startswith(f"{spec}:6:51: error: 'TestNope::*' matches no test in")
    assert len(errors) == 2


def test_check_every_error_of_every_file_at_once(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    one = tmp_path / "one.yaml"
    one.write_text(
        "test_suite_config:\n  files:\n    - path: a.py\n      unlisted_test_mode: nope\n      bogus: 1\n"
    )
    two = tmp_path / "two.yaml"
    two.write_text("test_suite_config: {labels: [x], extra: 1}\n")
    result = cli("specs", "check", one, two)
    assert result.code == 1
    assert [line.split(": error")[0] for line in result.stdout.splitlines()] == [
        f"{one}:4:27",
        f"{one}:5:7",
        f"{two}:1:34",
    ]


def test_pytorch_checkout_spec_is_well_formed(cli: Callable[..., CliResult]) -> None:
    result = cli("specs", "check", BUNDLED_SPECS / "pytorch")
    assert result.code == 0, result.output


def test_unknown_backend_and_missing_upstream(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    spec = BUNDLED_SPECS / "spyre_view_ops.yaml"
    backend = cli("run", "--spec", spec, "--upstream", sample_upstream.path, "--backend", "tpu")
    assert (
        backend.code == 2
        and "unknown backend 'tpu' (known: cpu, spyre, spyre-emu)" in backend.stderr
    )
    missing = cli("run", "--spec", spec, "--upstream", tmp_path / "nowhere")
    assert missing.code == 2 and "is not a directory" in missing.stderr
    none = cli("run", "--spec", spec)
    assert none.code == 2 and "pass --upstream DIR or set TORCH_ROOT" in none.stderr


@pytest.mark.slow
def test_spec_demo_runs_the_bundled_specs(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    """The README's ``spec-demo`` finds the bundled specs wherever it is started from."""
    result = cli("spec-demo", "--workdir", tmp_path / "demo")
    assert result.code == 0, result.output
    assert "specs: spyre_binary_ufuncs.yaml" in result.stdout
    ran = int(result.stdout.split(" test variants ran as the specs expect")[0].split()[-1])
    assert ran > 50
