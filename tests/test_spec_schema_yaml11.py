"""The spec schema agrees with the loader on number strings (issue #26, item 4).

The loader validates PyYAML's ``safe_load`` output, which is YAML 1.1: ``atol: 1e-3`` (no dot
in the mantissa) is a string there, and pydantic's lax mode makes a float of it. So the schema
``ci-relay specs schema`` prints must take such strings too, or an editor underlines a spec
that ``specs check`` accepts -- torch-spyre's own worked example among them. These tests read
the schema from the real command and compare it with the loader string by string.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from pydantic import ValidationError

from reuse_specs.schema import SpecFile

REPO_ROOT = Path(__file__).resolve().parents[1]
# torch-spyre's own files, unmodified (each folder's SOURCE.md names the commit and licence)
REAL_CONFIGS = (
    REPO_ROOT / "tests" / "data" / "torch-spyre" / "example_test_config.yaml",
    REPO_ROOT / "spyre_emu" / "published" / "nn-test_init.yaml",
)

# the strings every number field is checked on; whether each is valid is the loader's call
NUMBER_STRINGS = [
    *("1e-3", "1.0e-2", "0.5", ".5", "5.", "-1e3", "+2E5", "3", "1E+03", "00.5", "1.e3"),
    *("abc", "1e", "", " ", ".", "e3", ".e3", "1.2.3", "1e3.5", "5.e", "+", "-", "+-1", "1,5"),
    *("nan", "NaN", "-nan", "inf", "+inf", "-inf", "Infinity", "INF", "infinit", "infinityy"),
    *("-0", "-0.0", "-.0", "-0e5", "0e0", "3.0", "3.00", "-3", "+3", "0001", "-00"),
    *(" 1e-3", "1e-3 ", "\t2\n", "\xa01", "1\u2000", "1e-3\n", "\ufeff1", "\x1c1", "0x10", "0b1"),
    *("1_000", "1_0.5", "1_.5", "1._5", "1_e3", "1e_3", "i_nf", "+_1", "-_1", "1_0.0"),
    *(" 1_000", "1_000 ", "1__0", "_1", "1_", "inf_", "3.0_0", "1_0\n", "\u0663", "\uff13"),
]


def _spec(field: str, value: object) -> dict[str, Any]:
    """A minimal spec with ``value`` in ``field`` (a tolerance, or the input seed)."""
    if field == "seed":
        return {"test_suite_config": {"global": {"input_config": {"seed": value}}}}
    precision = {field: value}
    dtype = {"name": "float16", "precision": precision}
    return {"test_suite_config": {"global": {"supported_dtypes": [dtype]}}}


def _loader_accepts(document: dict[str, Any]) -> bool:
    try:
        SpecFile.model_validate(document)
    except ValidationError:
        return False
    return True


@pytest.fixture(scope="module")
def validator(tmp_path_factory: pytest.TempPathFactory) -> Validator:
    """A validator for the schema the real command prints, of the draft it declares."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "ci_relay", "specs", "schema"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path_factory.mktemp("schema"),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _real_config(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_the_real_torch_spyre_configs_validate_as_yaml_1_1_reads_them(
    validator: Validator,
) -> None:
    example = _real_config(REAL_CONFIGS[0])
    add = example["test_suite_config"]["global"]["supported_ops"][0]
    assert add["dtypes"][0]["precision"] == {"atol": "1e-3", "rtol": "1e-3"}  # YAML 1.1 strings
    errors = []
    for path in REAL_CONFIGS:
        data = _real_config(path)
        SpecFile.model_validate(data)  # the loader's models accept it
        errors += [
            f"{path.name} at {list(e.absolute_path)}: {e.message}"
            for e in validator.iter_errors(data)
        ]
    assert errors == []


@pytest.mark.parametrize("field", ["atol", "rtol", "seed"])
def test_the_schema_takes_exactly_the_number_strings_the_loader_takes(
    field: str, validator: Validator
) -> None:
    """Per string: schema and loader say the same, and the check is not vacuous."""
    accepted = {s for s in NUMBER_STRINGS if _loader_accepts(_spec(field, s))}
    assert {"3", "+3", "-0", "3.0", "1_000", "\t2\n"} <= accepted
    assert not {"abc", "1e", "", "1.2.3", "1__0", "0x10", "\u0663"} & accepted
    if field == "seed":
        assert {"-3", " 1_000", "1_0.0"} <= accepted
    else:  # ge=0: "-1e3" is the loader's to refuse, and NaN fails the bound
        assert {"1e-3", "1.0e-2", ".5", "5.", "+2E5", "inf", "1_.5", "-0.0"} <= accepted
        assert not {"-1e3", "nan", "-inf", " 1_000"} & accepted
    disagreements = [
        f"{s!r}: loader {'accepts' if s in accepted else 'rejects'}, schema does not"
        for s in NUMBER_STRINGS
        if validator.is_valid(_spec(field, s)) != (s in accepted)
    ]
    assert disagreements == []


def _leading_zero_quirk(text: str) -> bool:
    """pydantic-core reads an int string whose leading zeros run into '-' or '__' by
    skipping them (``0-1`` is -1, ``0__1`` is 1): a parser quirk the schema does not copy."""
    digits = text.strip().lstrip("+-")
    return digits.startswith("0") and ("-" in digits or "__" in digits)


@pytest.mark.parametrize("field", ["atol", "seed"])
def test_schema_and_loader_agree_on_every_short_string(field: str, validator: Validator) -> None:
    """Every string of up to four characters over the alphabet numbers are spelt with."""
    disagreements = []
    for length in range(5):
        for chars in itertools.product("01.e-+_ ", repeat=length):
            text = "".join(chars)
            loader = _loader_accepts(_spec(field, text))
            if validator.is_valid(_spec(field, text)) == loader:
                continue
            if field == "seed" and loader and _leading_zero_quirk(text):
                continue
            disagreements.append(f"{text!r}: loader {'accepts' if loader else 'rejects'}")
    assert disagreements == []
    assert validator.is_valid(_spec(field, "1e-3" if field == "atol" else "+1_0"))


BASELINE: dict[str, Any] = {
    "test_suite_config": {
        "global": {
            "supported_dtypes": [{"name": "float16", "precision": {"atol": "1e-3", "rtol": "0"}}],
            "input_config": {"seed": "7"},
        }
    }
}
STILL_REJECTED = {
    "atol: abc": ("supported_dtypes", "atol", "abc"),
    "atol: -1e-3": ("supported_dtypes", "atol", "-1e-3"),
    "rtol: 1e": ("supported_dtypes", "rtol", "1e"),
    "seed: 1e3": ("input_config", "seed", "1e3"),
    "seed: 7.5": ("input_config", "seed", "7.5"),
    "an unknown key beside atol": ("supported_dtypes", "tolerance", "1e-3"),
    "an unknown key beside seed": ("input_config", "salt", "7"),
}


@pytest.mark.parametrize("case", sorted(STILL_REJECTED))
def test_the_schema_stays_strict_around_number_strings(case: str, validator: Validator) -> None:
    """A spec with number strings validates; one bad string or unknown key beside them does not."""
    assert list(validator.iter_errors(BASELINE)) == []
    block, key, value = STILL_REJECTED[case]
    bad = json.loads(json.dumps(BASELINE))
    target = bad["test_suite_config"]["global"][block]
    (target[0]["precision"] if block == "supported_dtypes" else target)[key] = value
    assert not _loader_accepts(bad)
    assert not validator.is_valid(bad), f"schema accepted {case}"
