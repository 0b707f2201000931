"""Errors that point at the exact place in a spec file a maintainer must edit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class SourceLocation:
    """A 1-based line and column in a spec file."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class SpecError:
    """One problem in a spec, with where it is and what was expected."""

    location: SourceLocation
    message: str

    def __str__(self) -> str:
        return f"{self.location}: error: {self.message}"


class SpecErrors(Exception):
    """Every problem found in a set of spec files; nothing may run while any exists."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = sorted(errors, key=lambda e: e.location)
        super().__init__("\n".join(str(e) for e in self.errors))
