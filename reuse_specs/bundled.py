"""Where the Spyre specs that ship with the package live (the relay's default specs).

A submodule, not the package's ``__init__``: a downstream repository that keeps its own
specs in a ``reuse_specs/`` folder turns this package into a namespace package when the
command runs from its root with an editable install, and then only submodules import.
"""

from pathlib import Path

BUNDLED_SPECS = Path(__file__).resolve().parent / "specs"
