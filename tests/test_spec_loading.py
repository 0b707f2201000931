"""Schema validation and merging: accepted formats and precise rejections."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from reuse_specs import Mode, SpecErrors, load_specs

DATA = Path(__file__).parent / "data"


def _errors(paths: list[Path], upstream: Path | None = None) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        load_specs(paths, upstream)
    return [str(e) for e in info.value.errors]


def test_every_key_of_the_format_loads(tmp_path: Path) -> None:
    spec = load_specs([DATA / "every_key.yaml"], tmp_path)
    (entry,) = spec.files
    assert entry.unlisted_test_mode is Mode.XFAIL_STRICT
    first = entry.rules[0].entry
    assert first.names == ["TestBinaryUfuncs::test_add"]  # a single string becomes a list
    assert first.no_grad and first.tags == ["smoke", "model_granite"]
    assert first.edits.dtypes.include[0].precision is not None
    assert [f.name for f in first.edits.functions.cpu_move] == ["assertEqual", "assertTrue"]
    glob = entry.global_config
    assert [d.name for d in glob.supported_dtypes] == ["float16", "float16", "float32"]
    assert glob.supported_ops is not None and glob.supported_ops[0].name == "add"
    assert glob.supported_modules is not None and glob.supported_modules[0].name == "torch.nn.ReLU"
    assert glob.input_config.seed == 42
    # input-generation blocks are accepted, and reported as not applied
    assert len(spec.opaque_inputs) == 6


def test_unknown_keys_name_the_key_and_the_expected_ones(write_spec: Callable[..., Path]) -> None:
    path = write_spec(
        """
        test_suite_config:
          files:
            - path: x.py
              tests:
                - names: [A::test_b]
                  mdoe: skip
          globl: {}
        """
    )
    errors = _errors([path])
    assert errors == [
        f"{path}:6:11: error: unknown key 'mdoe' in test_suite_config.files[0].tests[0] "
        "(expected one of: names, mode, tags, labels, no_grad, edits)",
        f"{path}:7:3: error: unknown key 'globl' in test_suite_config "
        "(expected one of: labels, files, global)",
    ]


def test_unknown_mode_and_dtype(write_spec: Callable[..., Path]) -> None:
    path = write_spec(
        """
        test_suite_config:
          files:
            - path: x.py
              unlisted_test_mode: xfial
              tests:
                - names: [A::test_b]
                  edits: {dtypes: {exclude: [{name: flaot16}]}}
          global:
            supported_dtypes: [{name: float16}, {name: bfloat17}]
        """
    )
    errors = _errors([path])
    assert errors[0].startswith(
        f"{path}:4:27: error: test_suite_config.files[0].unlisted_test_mode: unknown mode 'xfial'"
    )
    assert "expected one of: mandatory_success, xfail, xfail_strict, skip" in errors[0]
    assert errors[1].startswith(f"{path}:7:45: error:") and "unknown dtype 'flaot16'" in errors[1]
    assert "did you mean float16" in errors[1]
    assert errors[2].startswith(f"{path}:9:48: error:") and "unknown dtype 'bfloat17'" in errors[2]


def test_bad_values_and_missing_keys(write_spec: Callable[..., Path]) -> None:
    path = write_spec(
        """
        test_suite_config:
          files:
            - path: x.py
              tests:
                - names: ["A::B::test_c"]
                - mode: skip
                - names: [A::test_d]
                  no_grad: maybe
        """
    )
    errors = _errors([path])
    assert any(
        e.startswith(f"{path}:5:19: error:") and "invalid test name 'A::B::test_c'" in e
        for e in errors
    )
    assert any(
        e.startswith(f"{path}:6:11: error:") and "missing required key 'names'" in e for e in errors
    )
    assert any(e.startswith(f"{path}:8:20: error:") and "no_grad" in e for e in errors)


def test_top_level_must_be_the_suite_mapping(write_spec: Callable[..., Path]) -> None:
    assert "missing required key 'test_suite_config'" in _errors([write_spec("files: []\n")])[0]
    assert "expected a mapping" in _errors([write_spec("- a\n- b\n")])[0]


def test_duplicate_names_with_conflicting_modes(write_spec: Callable[..., Path]) -> None:
    first = write_spec(
        """
        test_suite_config:
          files:
            - path: x.py
              tests:
                - names: [A::test_b, A::test_c]
                  mode: xfail
        """
    )
    second = write_spec(
        """
        test_suite_config:
          files:
            - path: x.py
              tests:
                - names: [A::test_c]
                  mode: skip
                - names: [A::test_b]
                  mode: xfail
        """
    )
    (error,) = _errors([first, second])
    assert error.startswith(f"{second}:5:19: error: 'A::test_c' is listed with mode skip here")
    assert f"but xfail at {first}:5:30" in error


def test_several_files_merge(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_a.py").write_text("class TestA:\n    def test_x(self): pass\n")
    (tmp_path / "test" / "test_b.py").write_text("def test_y(): pass\n")
    one = write_spec(
        "test_suite_config:\n  labels: [trunk]\n  files:\n    - path: ${TORCH_ROOT}/test/test_a.py\n"
    )
    two = write_spec(
        "test_suite_config:\n  labels: [nightly]\n  files:\n    - path: ${TORCH_ROOT}/test/test_*.py\n"
    )
    spec = load_specs([one, two], tmp_path)
    assert spec.labels == ("trunk", "nightly")
    assert [p.name for p in spec.test_files()] == ["test_a.py", "test_b.py"]


def test_one_test_file_gets_one_global_section(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    (tmp_path / "t.py").write_text("def test_y(): pass\n")
    one = write_spec(
        "test_suite_config:\n  files: [{path: '${TORCH_ROOT}/t.py'}]\n  global: {supported_dtypes: [{name: float16}]}\n"
    )
    two = write_spec(
        "test_suite_config:\n  files: [{path: '${TORCH_ROOT}/t.py'}]\n  global: {supported_dtypes: [{name: float32}]}\n"
    )
    (error,) = _errors([one, two], tmp_path)
    assert error.startswith(f"{two}:2:18: error:") and "global section differs" in error


def test_all_files_are_reported_together(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    bad1 = write_spec("test_suite_config: {files: [{path: x, mode: 1}]}\n")
    bad2 = write_spec("test_suite_config: {labels: 3}\n")
    errors = _errors([bad1, bad2, tmp_path / "missing.yaml"])
    assert len(errors) == 3
    assert {e.split(":")[0] for e in errors} == {
        str(bad1),
        str(bad2),
        str(tmp_path / "missing.yaml"),
    }
