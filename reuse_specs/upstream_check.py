"""Checks that need the upstream tree: files exist, globs match, test names are real.

What a spec lists and the tree at one revision lacks is *drift*: upstream added, renamed or
removed a test since the spec was written. Drift is reported, never a reason to run nothing:
a run goes on with what still exists (:func:`find_drift`), while ``specs check --upstream``
stays strict (:func:`check_against_upstream`) so that spec lint catches it. Each drift item
carries the likeliest new name (a close name in the same file, or the same name in another
class) so the maintainer's edit is quick.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from reuse_specs.errors import SourceLocation, SpecError, SpecErrors
from reuse_specs.loader import FileRules, LoadedSpec, NamePattern
from reuse_specs.modes import Mode
from reuse_specs.upstream_index import FileTests, index_test_file

DriftKind = Literal["file", "name", "unparsable"]


@dataclass(frozen=True)
class SpecDrift:
    """One thing a spec lists that the upstream tree does not have at this revision."""

    kind: DriftKind
    location: SourceLocation
    listed: str  # the path, glob or test name as the spec writes it
    where: str  # the file (or path pattern) it was looked for in
    message: str
    likely: str | None = None  # the likeliest rename, when one stands out

    @property
    def text(self) -> str:
        """The message with the rename hint, without the location."""
        return f"{self.message}; likely renamed to {self.likely!r}" if self.likely else self.message

    def __str__(self) -> str:
        return f"{self.location}: {self.text}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "file": self.location.file,
            "line": self.location.line,
            "listed": self.listed,
            "where": self.where,
            "message": self.message,
            "likely": self.likely,
        }


def _matching_classes(pattern: NamePattern, tests: FileTests) -> list[str]:
    """The classes of ``tests`` with a method the pattern names (class part globbed too)."""
    method, cls = pattern.method_part, pattern.class_part
    return [
        name
        for name, methods in tests.classes.items()
        if (cls is None or fnmatchcase(name, cls)) and any(fnmatchcase(m, method) for m in methods)
    ]


def _name_exists(pattern: NamePattern, tests: FileTests) -> bool:
    if _matching_classes(pattern, tests):
        return True
    return pattern.class_part is None and any(
        fnmatchcase(f, pattern.method_part) for f in tests.functions
    )


def _likely_test(pattern: NamePattern, indexes: list[FileTests]) -> str | None:
    """The same method in another class (moved), else the closest name in the listed class
    (renamed), else the closest test name anywhere in the file(s); ``None`` for globs."""
    if pattern.is_glob:
        return None
    method, cls = pattern.method_part, pattern.class_part
    moved = sorted(
        f"{name}::{method}"
        for tests in indexes
        for name, methods in tests.classes.items()
        if method in methods and name != cls
    )
    if moved:
        return moved[0]
    in_class = sorted({m for tests in indexes for m in tests.classes.get(cls or "", ())})
    close = difflib.get_close_matches(method, in_class, n=1, cutoff=0.75)
    if close:
        return f"{cls}::{close[0]}" if cls else close[0]
    everywhere = {
        f"{name}::{m}" if cls else m: m
        for tests in indexes
        for name, methods in tests.classes.items()
        for m in methods
    } | {f: f for tests in indexes for f in tests.functions if f.startswith("test")}
    close = difflib.get_close_matches(method, list(everywhere.values()), n=1, cutoff=0.8)
    if not close:
        return None
    return next(full for full, short in sorted(everywhere.items()) if short == close[0])


def _likely_file(entry: FileRules, upstream: Path | None) -> str | None:
    """A test file with a close name in the folder the missing path names."""
    if entry.is_glob or upstream is None:
        return None
    raw = entry.raw_path.replace("${TORCH_ROOT}", str(upstream))
    folder, name = Path(raw).parent, Path(raw).name
    if not folder.is_dir():
        return None
    siblings = sorted(p.name for p in folder.glob("*.py"))
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.8)
    if not close:
        return None
    return entry.raw_path[: len(entry.raw_path) - len(name)] + close[0]


def _file_drift(entry: FileRules, upstream: Path | None) -> list[SpecDrift]:
    if not entry.resolved:
        what = "glob matches no file" if entry.is_glob else "no such file"
        return [
            SpecDrift(
                "file",
                entry.location,
                entry.raw_path,
                entry.raw_path,
                f"{what}: {entry.raw_path}",
                _likely_file(entry, upstream),
            )
        ]
    drift: list[SpecDrift] = []
    indexes = [index_test_file(p) for p in entry.resolved]
    for path, tests in zip(entry.resolved, indexes, strict=True):
        if tests.syntax_error:
            drift.append(
                SpecDrift(
                    "unparsable",
                    entry.location,
                    entry.raw_path,
                    str(path),
                    f"{path} does not parse: {tests.syntax_error}",
                )
            )
    for rule in entry.rules:
        for pattern in rule.names:
            if not any(_name_exists(pattern, tests) for tests in indexes):
                where = str(entry.resolved[0]) if len(entry.resolved) == 1 else entry.raw_path
                kind = "matches no test" if pattern.is_glob else "is not a test"
                drift.append(
                    SpecDrift(
                        "name",
                        pattern.location,
                        pattern.text,
                        where,
                        f"{pattern.text!r} {kind} in {where}",
                        _likely_test(pattern, indexes),
                    )
                )
    return drift


def _token_errors(spec: LoadedSpec) -> list[SpecError]:
    return [
        SpecError(
            entry.location,
            f"cannot resolve ${{{entry.unresolved_token}}} in {entry.raw_path!r}: "
            "pass --upstream or set it in the environment",
        )
        for entry in spec.files
        if entry.unresolved_token is not None
    ]


def _drift(spec: LoadedSpec) -> list[SpecDrift]:
    drift = [
        d
        for entry in spec.files
        if entry.unresolved_token is None
        for d in _file_drift(entry, spec.upstream)
    ]
    return sorted(drift, key=lambda d: d.location)


def find_drift(spec: LoadedSpec) -> list[SpecDrift]:
    """What the spec lists that this tree lacks, for a run to report and go on without.

    A path whose ``${TOKEN}`` cannot be resolved is not drift but a set-up mistake: it raises
    :class:`SpecErrors`, since nothing tells which upstream file was meant.
    """
    errors = _token_errors(spec)
    if errors:
        raise SpecErrors(errors)
    return _drift(spec)


def check_against_upstream(spec: LoadedSpec) -> None:
    """Raise :class:`SpecErrors` for every path, glob or test name the tree lacks (strict:
    what spec lint runs), each drift item with its likely rename."""
    errors = _token_errors(spec) + [SpecError(d.location, d.text) for d in _drift(spec)]
    if errors:
        raise SpecErrors(errors)


def hardware_generic_listings(spec: LoadedSpec) -> list[str]:
    """Listed tests of plain classes (no device parameter), as ``FILE:LINE: warning`` lines:
    under a device backend they run on the CPU, not on the card, and the result says so.
    torch-spyre's framework warns about the same listings."""
    warnings = []
    for rules in spec.files:
        indexes = [index_test_file(p) for p in rules.resolved if p.is_file()]
        for rule in rules.rules:
            if rule.entry.mode is Mode.SKIP:
                continue
            for pattern in rule.names:
                plain = sorted(
                    name
                    for tests in indexes
                    for name in _matching_classes(pattern, tests)
                    if name not in tests.device_classes
                )
                if plain:
                    warnings.append(
                        f"{pattern.location}: warning: {pattern.text!r} names a hardware-generic "
                        f"test ({', '.join(plain)}: no device parameter); under a device "
                        "backend it runs on the CPU, not on the card, and its result says so"
                    )
    return warnings
