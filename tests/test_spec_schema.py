"""``ci-relay specs schema``: the spec format's JSON Schema, generated from the loader's own
models. The copy shipped next to the bundled specs (which name it on their first line for
editors) must be what the command prints; every bundled spec must validate; and a spec the
loader rejects for its structure must be rejected by the schema too."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from reuse_specs.bundled import BUNDLED_SPECS
from reuse_specs.errors import SpecErrors
from reuse_specs.loader import load_specs
from reuse_specs.schema import json_schema
from tests.conftest import CliResult

SHIPPED = BUNDLED_SPECS.parent / "spec.schema.json"
BUNDLED = sorted(BUNDLED_SPECS.rglob("*.yaml"))


def _validator() -> Draft202012Validator:
    schema = json_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def test_the_command_prints_the_shipped_schema(cli: Callable[..., CliResult]) -> None:
    result: CliResult = cli("specs", "schema")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(SHIPPED.read_text())
    assert json.loads(result.stdout) == json_schema()  # regenerate: ci-relay specs schema -o


def test_the_command_writes_a_file_and_says_so(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    result: CliResult = cli("specs", "schema", "--output", str(tmp_path / "spec.schema.json"))
    assert result.code == 0
    assert json.loads((tmp_path / "spec.schema.json").read_text()) == json_schema()
    missing: CliResult = cli("specs", "schema", "-o", str(tmp_path / "no" / "such" / "x.json"))
    assert missing.code == 2 and "cannot write" in missing.stderr


@pytest.mark.parametrize("spec", BUNDLED, ids=lambda p: p.name)
def test_every_bundled_spec_validates_and_names_the_schema(spec: Path) -> None:
    first = spec.read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    assert (spec.parent / first.split("=", 1)[1]).resolve() == SHIPPED.resolve()
    errors = list(_validator().iter_errors(yaml.safe_load(spec.read_text())))
    assert errors == []


STRUCTURE_ERRORS = {
    "unknown top-level key": "test_suite_config: {files: []}\nextra: 1\n",
    "unknown key in a file entry": (
        "test_suite_config:\n  files:\n    - path: a.py\n      unlisted: xfail\n"
    ),
    "files is a mapping": "test_suite_config:\n  files: {path: a.py}\n",
    "a test entry without names": (
        "test_suite_config:\n  files:\n    - path: a.py\n      tests:\n        - mode: skip\n"
    ),
    "an unknown mode": (
        "test_suite_config:\n  files:\n    - path: a.py\n      unlisted_test_mode: maybe\n"
    ),
    "a negative tolerance": (
        "test_suite_config:\n  global:\n    supported_dtypes:\n"
        "      - name: float16\n        precision: {atol: -1}\n"
    ),
    "an unknown edit": (
        "test_suite_config:\n  files:\n    - path: a.py\n      tests:\n"
        "        - names: [T::t]\n          edits: {ops: {add: [abs]}}\n"
    ),
    "supported_ops is a string": "test_suite_config:\n  global:\n    supported_ops: abs\n",
    "an empty path": "test_suite_config:\n  files:\n    - path: ''\n",
    "no test_suite_config": "files: []\n",
}


@pytest.mark.parametrize("name", sorted(STRUCTURE_ERRORS))
def test_what_the_loader_rejects_for_structure_the_schema_rejects(
    name: str, tmp_path: Path
) -> None:
    text = STRUCTURE_ERRORS[name]
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    with pytest.raises(SpecErrors):
        load_specs([spec], None)
    assert list(_validator().iter_errors(yaml.safe_load(text))), f"schema accepted: {name}"


def test_the_short_forms_the_loader_accepts_validate_too(tmp_path: Path) -> None:
    text = (
        "test_suite_config:\n  files:\n    - path: a.py\n      tests:\n"
        "        - names: T::t\n          mode: skip\n"
        "  global:\n    supported_ops: [abs, {name: neg, force_xfail: true}]\n"
    )
    spec = tmp_path / "short.yaml"
    spec.write_text(text)
    load_specs([spec], None)
    assert list(_validator().iter_errors(yaml.safe_load(text))) == []
