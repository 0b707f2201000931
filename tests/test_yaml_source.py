"""Safe YAML reading: every rejection names file:line:col."""

from __future__ import annotations

from pathlib import Path

import pytest

from reuse_specs.errors import SpecErrors
from reuse_specs.yaml_source import MAX_SPEC_BYTES, load_yaml


def _errors(path: Path) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        load_yaml(path)
    return [str(e) for e in info.value.errors]


def test_positions_of_keys_and_values(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("top:\n  items:\n    - name: x\n      mode: skip\n", encoding="utf-8")
    doc = load_yaml(path)
    assert doc.data == {"top": {"items": [{"name": "x", "mode": "skip"}]}}
    assert (
        doc.locate(("top", "items", 0, "mode")).line,
        doc.locate(("top", "items", 0, "mode")).column,
    ) == (4, 13)
    assert doc.locate_key(("top", "items", 0, "mode")).column == 7
    # a path that does not exist falls back to its closest ancestor
    assert doc.locate(("top", "items", 0, "missing")).line == 3


def test_non_utf8_points_at_the_bad_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("a: 1\nb: caf\xe9\n".encode("latin-1"))
    (error,) = _errors(path)
    assert error.startswith(f"{path}:2:7: error: file is not valid UTF-8 (byte 0xe9)")


def test_python_tags_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("a: !!python/object/apply:os.system ['touch pwned']\n", encoding="utf-8")
    (error,) = _errors(path)
    assert f"{path}:1:4: error:" in error
    assert "python/object/apply:os.system" in error
    assert not (tmp_path / "pwned").exists()


def test_custom_tag_on_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tag.yaml"
    path.write_text("a: !custom {b: 1}\n", encoding="utf-8")
    (error,) = _errors(path)
    assert "1:4" in error and "'!custom' is not allowed" in error


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    levels = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        refs = ",".join(f"*a{i - 1}" for _ in range(9))
        levels.append(f"a{i}: &a{i} [{refs}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(levels) + "\n", encoding="utf-8")
    errors = _errors(path)
    assert len(errors) == 1
    assert "alias bomb" in errors[0]
    assert errors[0].startswith(f"{path}:")


def test_small_anchors_and_merge_keys_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "base: &base {mode: xfail, tags: [a]}\nentry:\n  <<: *base\n  names: [x]\n",
        encoding="utf-8",
    )
    assert load_yaml(path).data["entry"] == {"mode": "xfail", "tags": ["a"], "names": ["x"]}


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("a: &a [1, *a]\n", encoding="utf-8")
    (error,) = _errors(path)
    assert "recursive YAML alias" in error


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("a: 1\nb: 2\na: 3\n", encoding="utf-8")
    (error,) = _errors(path)
    assert error.startswith(f"{path}:3:1: error: duplicate key 'a'")


def test_syntax_error_has_position(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("a:\n  - b\n c: [\n", encoding="utf-8")
    (error,) = _errors(path)
    assert error.startswith(f"{path}:3:") and "invalid YAML" in error


def test_empty_missing_and_oversized_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n", encoding="utf-8")
    assert "empty file" in _errors(empty)[0]
    assert _errors(tmp_path / "absent.yaml")[0].endswith("error: no such file")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: " + b"x" * MAX_SPEC_BYTES + b"\n")
    assert "spec files are limited" in _errors(big)[0]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "1:"),  # found by the spec loader fuzzing
        ("a: &a " + "[" * 40 + "x" + "]" * 40 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n", "1:"),
    ],
    ids=["deep", "deep-through-an-alias"],
)
def test_deep_nesting_is_refused_not_a_crash(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text, encoding="utf-8")
    (error,) = _errors(path)
    assert error.startswith(f"{path}:{where}") and "nested deeper than 64 levels" in error


def test_a_tagged_scalar_that_is_not_its_type_is_an_error(tmp_path: Path) -> None:
    """Found by the fuzzing campaign: PyYAML raised a bare ValueError for this."""
    path = tmp_path / "tag.yaml"
    path.write_text("a: !!int 0x1F oops\n", encoding="utf-8")
    (error,) = _errors(path)
    assert error.startswith(f"{path}:1:4: error: cannot read '0x1F oops' as int")
