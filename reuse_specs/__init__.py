"""Reuse specs: which upstream PyTorch tests run on a backend, and how.

Reads torch-spyre's "Test Suite Configuration" YAML unchanged, validates it
with precise file:line:col errors, and applies it to a pytest session through
:mod:`reuse_specs.pytest_plugin`.
"""

from pathlib import Path

from reuse_specs.errors import SourceLocation, SpecError, SpecErrors
from reuse_specs.loader import LoadedSpec, load_specs
from reuse_specs.modes import Mode

# the Spyre specs that ship with the package (the relay's default)
BUNDLED_SPECS = Path(__file__).resolve().parent / "specs"

__all__ = [
    "BUNDLED_SPECS",
    "LoadedSpec",
    "Mode",
    "SourceLocation",
    "SpecError",
    "SpecErrors",
    "load_specs",
]
