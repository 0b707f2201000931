"""Reuse specs: which upstream PyTorch tests run on a backend, and how.

Reads torch-spyre's "Test Suite Configuration" YAML unchanged, validates it
with precise file:line:col errors, and applies it to a pytest session through
:mod:`reuse_specs.pytest_plugin`.
"""

from reuse_specs.errors import SourceLocation, SpecError, SpecErrors
from reuse_specs.loader import LoadedSpec, load_specs
from reuse_specs.modes import Mode

__all__ = ["LoadedSpec", "Mode", "SourceLocation", "SpecError", "SpecErrors", "load_specs"]
