"""Pydantic models of torch-spyre's ``test_suite_config`` YAML format.

Field names, defaults and nesting follow the format as torch-spyre's configs
use it, so existing files load unchanged. Differences are deliberate and
stricter: every mapping rejects unknown keys, dtype names are checked against
torch's, and modes are a closed set.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from reuse_specs.dtypes import canonical_dtype, unknown_dtype_message
from reuse_specs.modes import MODE_NAMES, Mode


def _dtype_name(value: str) -> str:
    canonical = canonical_dtype(value)
    if canonical is None:
        raise ValueError(unknown_dtype_message(value))
    return canonical


def _mode(value: Any) -> Any:
    if isinstance(value, str) and value not in {m.value for m in Mode}:
        raise ValueError(f"unknown mode {value!r} (expected one of: {MODE_NAMES})")
    return value


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _test_name(value: str) -> str:
    parts = value.split("::")
    if len(parts) > 2 or not all(p.strip() for p in parts):
        raise ValueError(
            f"invalid test name {value!r}: expected 'ClassName::test_name' or 'test_name' "
            "(globs allowed in either part)"
        )
    return value


DtypeName = Annotated[str, AfterValidator(_dtype_name)]
ModeName = Annotated[Mode, BeforeValidator(_mode)]
TestName = Annotated[str, AfterValidator(_test_name)]
Opaque = dict[str, Any] | list[Any]
"""Input-generation blocks ci-relay accepts but does not interpret (see README)."""


class SpecModel(BaseModel):
    """Base for every mapping in a spec: unknown keys are errors, values immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Precision(SpecModel):
    atol: Annotated[float, Field(ge=0)] | None = None
    rtol: Annotated[float, Field(ge=0)] | None = None


class NamedItem(SpecModel):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None


class DtypeRef(SpecModel):
    name: DtypeName
    description: str | None = None


class DtypeItem(SpecModel):
    """A dtype with optional tolerance and forced xfail (supported_dtypes, edits includes)."""

    name: DtypeName
    description: str | None = None
    precision: Precision | None = None
    force_xfail: bool = False


class OpInclude(SpecModel):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    tags: list[str] = Field(default_factory=list)
    sample_inputs_func: Opaque | None = None


class ModuleInclude(SpecModel):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    module_path: str | None = None
    apply_device_layout: bool = False
    sample_inputs_func: Opaque | None = None
    constructor_inputs: Opaque | None = None
    forward_inputs: Opaque | None = None


class OpsEdits(SpecModel):
    include: list[OpInclude] = Field(default_factory=list)
    exclude: list[NamedItem] = Field(default_factory=list)


class DtypesEdits(SpecModel):
    include: list[DtypeItem] = Field(default_factory=list)
    exclude: list[DtypeRef] = Field(default_factory=list)


class ModulesEdits(SpecModel):
    include: list[ModuleInclude] = Field(default_factory=list)
    exclude: list[NamedItem] = Field(default_factory=list)


class FunctionsEdits(SpecModel):
    cpu_move: list[NamedItem] = Field(default_factory=list)
    """Test-case methods (e.g. assertEqual) whose tensor arguments move to CPU first."""


class TestEdits(SpecModel):
    ops: OpsEdits = Field(default_factory=OpsEdits)
    dtypes: DtypesEdits = Field(default_factory=DtypesEdits)
    modules: ModulesEdits = Field(default_factory=ModulesEdits)
    functions: FunctionsEdits = Field(default_factory=FunctionsEdits)


class TestEntry(SpecModel):
    __test__ = False  # not a pytest test class

    names: Annotated[
        list[TestName],
        BeforeValidator(_as_list, json_schema_input_type=str | list[str]),
        Field(min_length=1),
    ]
    mode: ModeName = Mode.MANDATORY_SUCCESS
    tags: list[str] = Field(default_factory=list)
    labels: list[str] = Field(default_factory=list)
    no_grad: bool = False
    edits: TestEdits = Field(default_factory=TestEdits)


class FileEntry(SpecModel):
    path: Annotated[str, Field(min_length=1)]
    unlisted_test_mode: ModeName = Mode.XFAIL
    labels: list[str] = Field(default_factory=list)
    tests: list[TestEntry] = Field(default_factory=list)


class SupportedOpDtype(SpecModel):
    name: DtypeName
    description: str | None = None
    precision: Precision | None = None


def _named(value: Any) -> Any:
    """Plain names in supported_ops / supported_modules mean ``{name: ...}``."""
    if isinstance(value, list):
        return [{"name": v} if isinstance(v, str) else v for v in value]
    return value


class SupportedOp(SpecModel):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    force_xfail: bool = False
    dtypes: list[SupportedOpDtype] = Field(default_factory=list)


class SupportedModule(SpecModel):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    force_xfail: bool = False
    dtypes: list[SupportedOpDtype] = Field(default_factory=list)
    constructor_inputs: Opaque | None = None
    forward_inputs: Opaque | None = None


class InputConfig(SpecModel):
    seed: int | None = None


class GlobalConfig(SpecModel):
    supported_dtypes: list[DtypeItem] = Field(default_factory=list)
    supported_ops: Annotated[
        list[SupportedOp] | None,
        BeforeValidator(_named, json_schema_input_type=list[str | SupportedOp] | None),
    ] = None
    supported_modules: Annotated[
        list[SupportedModule] | None,
        BeforeValidator(_named, json_schema_input_type=list[str | SupportedModule] | None),
    ] = None
    input_config: InputConfig = Field(default_factory=InputConfig)


class TestSuiteConfig(SpecModel):
    __test__ = False

    labels: list[str] = Field(default_factory=list)
    files: list[FileEntry] = Field(default_factory=list)
    global_: GlobalConfig = Field(default_factory=GlobalConfig, alias="global")


class SpecFile(SpecModel):
    """One YAML file: everything lives under ``test_suite_config``."""

    test_suite_config: TestSuiteConfig


SCHEMA_ID = "https://ci-relay.invalid/schemas/reuse-spec.json"

# Number strings, as pydantic's lax mode reads them (the loader validates PyYAML's safe_load
# output, and YAML 1.1 leaves e.g. ``1e-3`` a string). pydantic-core parses a float string
# with Rust's f64 grammar after trimming Unicode white space or, failing that, after removing
# single underscores (none leading, trailing or doubled) without trimming. An int string is
# trimmed, may hold single underscores between digits and may end in ``.0...``. The patterns
# say exactly that in the regex dialect JSON Schema and Python's ``re`` share: ``[0-9]``
# rather than ``\d`` (Unicode digits in ``re``); and ``$(?!\n)``, as ``re``'s ``$`` also
# matches before a final newline. Known gaps, none a real spec's: an int string longer than
# 4300 digits (the loader refuses it) and a negative float string that underflows to -0.0.
_SPACE = "[\\t-\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*"
_END = "$(?!\\n)"


def _word(word: str, sep: str) -> str:
    return sep.join(f"[{c.lower()}{c.upper()}]" for c in word)


def _then(sep: str, atom: str) -> str:
    """``atom``, after an optional underscore when ``sep`` allows one."""
    return f"(?:{sep}{atom})" if sep else atom


def _decimal(sep: str, digit: str) -> str:
    """Rust's f64 literal (``1``, ``1.``, ``.5``, ``1e-3``, ``2.5E+4``) over ``digit``."""
    more, dot = _then(sep, digit), _then(sep, "\\.")
    mantissa = f"(?:{digit}{more}*(?:{dot}{more}*)?|\\.{more}+)"
    exponent = f"{_then(sep, '[eE]')}{_then(sep, '[+-]')}?{_then(sep, '[0-9]')}+"
    return f"{mantissa}(?:{exponent})?"


def _signed_float(sep: str, non_negative: bool) -> str:
    inf = f"{_word('inf', sep)}(?:{sep}{_word('inity', sep)})?"
    if non_negative:  # "-0.0" passes ge=0, NaN fails every bound
        plus = f"(?:\\+{sep})?(?:{_decimal(sep, '[0-9]')}|{inf})"
        return f"(?:{plus}|-{sep}{_decimal(sep, '0')})"
    return f"(?:[+-]{sep})?(?:{_decimal(sep, '[0-9]')}|{inf}|{_word('nan', sep)})"


def float_string_pattern(non_negative: bool) -> str:
    """A string the loader accepts for a float field (``ge=0`` when ``non_negative``)."""
    trimmed = f"{_SPACE}{_signed_float('', non_negative)}{_SPACE}"
    return f"^(?:{trimmed}|{_signed_float('_?', non_negative)}){_END}"


def int_string_pattern() -> str:
    """A string the loader accepts for an unbounded int field."""
    return f"^{_SPACE}[+-]?[0-9](?:_?[0-9])*(?:\\.0+)?{_SPACE}{_END}"


def _non_negative(schema: core_schema.FloatSchema | core_schema.IntSchema) -> bool:
    """Whether the field is ``ge=0``; other bounds have no pattern yet, so refuse them rather
    than publish a schema that disagrees with the loader."""
    bounds = {k: schema.get(k) for k in ("ge", "gt", "le", "lt", "multiple_of")}
    bounds = {k: v for k, v in bounds.items() if v is not None}
    if bounds in ({}, {"ge": 0}) and schema.get("allow_inf_nan", True):
        return bool(bounds)
    raise NotImplementedError(f"no number-string pattern for a {schema['type']} with {bounds}")


class _SpecJsonSchema(GenerateJsonSchema):
    """Number fields also take the strings the loader makes numbers of, so a spec that
    ``specs check`` accepts (``atol: 1e-3`` under YAML 1.1) is not underlined in an editor."""

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        number = super().float_schema(schema)
        if schema.get("strict"):
            return number
        pattern = float_string_pattern(_non_negative(schema))
        return {"anyOf": [number, {"type": "string", "pattern": pattern}]}

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        number = super().int_schema(schema)
        if schema.get("strict"):
            return number
        if _non_negative(schema):
            raise NotImplementedError("no number-string pattern for a non-negative int")
        return {"anyOf": [number, {"type": "string", "pattern": int_string_pattern()}]}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a spec file, generated from the models the loader validates with
    (so an editor's completion and errors cannot drift from what ``specs check`` says).
    Structure only: dtype names, test-name shapes and paths are checked by the loader."""
    schema = SpecFile.model_json_schema(
        mode="validation", by_alias=True, schema_generator=_SpecJsonSchema
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "ci-relay reuse spec (torch-spyre test_suite_config)",
        **schema,
    }
