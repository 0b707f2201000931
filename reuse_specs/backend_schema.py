"""The backend declaration's format: the models a declaration is validated with, and the JSON
Schema editors read (``reuse_specs/backend.schema.json``, generated from the same models so
an editor and ``ci-relay backends check`` cannot disagree).

A declaration is everything ci-relay needs to run upstream tests on one out-of-tree device:
how torch names its test classes, the environment PyTorch's test framework reads, what must
exist before a run (the preflight), and how its runner image is built. Paths in it are
relative to the declaration's own file.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

SCHEMA_ID = "https://github.com/ci-relay/ci-relay/backend.schema.json"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"  # a queue (exec.NAME) and an image name part
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
TOKEN = re.compile(r"\$\{(\w+)\}")


def _device_type(value: str) -> str:
    """torch puts the device type into class and method names: it must be an identifier."""
    if not value.isidentifier() or value != value.lower():
        raise ValueError(
            f"device_type {value!r} is not a valid lower-case Python identifier "
            "(torch names test classes TestFoo<DEVICE_TYPE> and tests test_bar_<device_type>)"
        )
    return value


def _relative_glob(value: str) -> str:
    if value.startswith("/") or ".." in value.split("/"):
        raise ValueError(f"device glob {value!r} must be a pattern under /dev (relative, no ..)")
    return value


def _short_module(value: Any) -> Any:
    return {"module": value} if isinstance(value, str) else value


DeviceType = Annotated[str, AfterValidator(_device_type)]
EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN)]


class DeclarationModel(BaseModel):
    """Base for every mapping of a declaration: unknown keys are errors, values immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RequiredModule(DeclarationModel):
    module: str = Field(pattern=MODULE_PATTERN, description="importable before a run")
    message: str | None = Field(
        default=None, description="the error when it is missing (default: names the module)"
    )


class RequiredDevices(DeclarationModel):
    glob: Annotated[str, AfterValidator(_relative_glob)] = Field(
        min_length=1, description="pattern under /dev at least one device must match"
    )
    message: str | None = Field(default=None, description="the error when none matches")
    setting: str | None = Field(
        default=None,
        pattern=ENV_NAME_PATTERN,
        description="a ci-relay setting whose value replaces glob on a machine (spyre_device_glob)",
    )


class Preflight(DeclarationModel):
    """What a run checks before any test: refused clearly, never run on the wrong device."""

    modules: list[Annotated[RequiredModule, BeforeValidator(_short_module)]] = Field(
        default_factory=list, description="modules (or {module, message}) that must import"
    )
    devices: RequiredDevices | None = None


class TestEnvironment(DeclarationModel):
    """What PyTorch's test framework reads to instantiate tests for this device."""

    __test__ = False

    torch_test_devices: str | None = Field(
        default=None,
        min_length=1,
        description="TORCH_TEST_DEVICES: the file defining TEST_CLASS (relative to this file, "
        "or ${PACKAGES}/... in ci-relay's packages)",
    )
    device_only_for: str = Field(
        min_length=1, description="PYTORCH_TESTING_DEVICE_ONLY_FOR (privateuse1, cpu, ...)"
    )


class Profile(DeclarationModel):
    """A device profile file (spyre-emu style: dtypes and ops), handed to the device through
    an environment variable unless the run's environment already names one."""

    file: str = Field(min_length=1, description="the profile (relative to this file)")
    env: EnvName = Field(description="the variable the device reads it from (SPYRE_EMU_PROFILE)")


class ImageRequirement(DeclarationModel):
    """Inputs of the build that are not public: the build refuses clearly without them."""

    what: str = Field(min_length=1, description="what they are, for the refusal message")
    env: dict[EnvName, str] = Field(
        min_length=1, description="environment variable -> what it must name"
    )


class RunnerImage(DeclarationModel):
    """The runner image ``ci-relay images build --backend NAME`` makes from one template."""

    from_backend: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="build on this backend's runner image (built first) instead of a base",
    )
    base_image: str | None = Field(
        default=None,
        min_length=1,
        description="a vendor image instead of the shared Debian base; ${VAR} from requires",
    )
    packages: list[str] = Field(
        default_factory=list,
        description="Python packages installed with the runner's own (from the shared "
        "wheelhouse or the wheels folder)",
    )
    wheels: str | None = Field(
        default=None,
        min_length=1,
        description="a folder of wheels to install from (relative to this file, or ${VAR})",
    )
    debian_packages: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9+.-]+$")]] = Field(
        default_factory=list, description="added to the shared Debian base (debootstrap)"
    )
    env: dict[EnvName, str] = Field(default_factory=dict, description="baked into the image")
    check: str | None = Field(
        default=None, min_length=1, description="Python code run at build time: the device works"
    )
    requires: ImageRequirement | None = None


class BackendDeclaration(DeclarationModel):
    """One backend: ``name`` is what ``--backend``, the policy, the queue and the image use."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(min_length=1)
    device_type: DeviceType = Field(description="the device torch names test classes with")
    test_env: TestEnvironment
    env: dict[EnvName, str] = Field(default_factory=dict, description="more variables for a run")
    env_defaults: dict[EnvName, str] = Field(
        default_factory=dict, description="set for a run unless already set"
    )
    processes_per_device: int = Field(
        default=0, ge=0, description="parallel test processes per device (0: no bound)"
    )
    fork_safe: bool = Field(
        default=True,
        description="a crashed test's process may be forked from the collected one",
    )
    preflight: Preflight = Field(default_factory=Preflight)
    profile: Profile | None = None
    image: RunnerImage = Field(default_factory=RunnerImage)


def backend_json_schema() -> dict[str, Any]:
    """The JSON Schema of a declaration (structure only: files and clashes are the loader's)."""
    schema = BackendDeclaration.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "ci-relay backend declaration",
        **schema,
    }
