"""Pydantic models of torch-spyre's ``test_suite_config`` YAML format.

Field names, defaults and nesting follow the format as torch-spyre's configs
use it, so existing files load unchanged. Differences are deliberate and
stricter: every mapping rejects unknown keys, dtype names are checked against
torch's, and modes are a closed set.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

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


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a spec file, generated from the models the loader validates with
    (so an editor's completion and errors cannot drift from what ``specs check`` says).
    Structure only: dtype names, test-name shapes and paths are checked by the loader."""
    schema = SpecFile.model_json_schema(mode="validation", by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "ci-relay reuse spec (torch-spyre test_suite_config)",
        **schema,
    }
