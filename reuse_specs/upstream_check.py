"""Checks that need the upstream tree: files exist, globs match, test names are real."""

from __future__ import annotations

from fnmatch import fnmatchcase

from reuse_specs.errors import SpecError, SpecErrors
from reuse_specs.loader import FileRules, LoadedSpec, NamePattern
from reuse_specs.upstream_index import FileTests, index_test_file


def _name_exists(pattern: NamePattern, tests: FileTests) -> bool:
    method = pattern.method_part
    cls = pattern.class_part
    for name, methods in tests.classes.items():
        if cls is not None and not fnmatchcase(name, cls):
            continue
        if any(fnmatchcase(m, method) for m in methods):
            return True
    return cls is None and any(fnmatchcase(f, method) for f in tests.functions)


def _check_file(entry: FileRules) -> list[SpecError]:
    if entry.unresolved_token is not None:
        return [
            SpecError(
                entry.location,
                f"cannot resolve ${{{entry.unresolved_token}}} in {entry.raw_path!r}: "
                "pass --upstream or set it in the environment",
            )
        ]
    if not entry.resolved:
        what = "glob matches no file" if entry.is_glob else "no such file"
        return [SpecError(entry.location, f"{what}: {entry.raw_path}")]
    errors: list[SpecError] = []
    indexes = [index_test_file(p) for p in entry.resolved]
    for path, tests in zip(entry.resolved, indexes, strict=True):
        if tests.syntax_error:
            errors.append(SpecError(entry.location, f"{path} does not parse: {tests.syntax_error}"))
    for rule in entry.rules:
        for pattern in rule.names:
            if not any(_name_exists(pattern, tests) for tests in indexes):
                where = entry.resolved[0] if len(entry.resolved) == 1 else entry.raw_path
                kind = "matches no test" if pattern.is_glob else "is not a test"
                errors.append(SpecError(pattern.location, f"{pattern.text!r} {kind} in {where}"))
    return errors


def check_against_upstream(spec: LoadedSpec) -> None:
    """Raise :class:`SpecErrors` for every path, glob or test name the tree lacks."""
    errors = [error for entry in spec.files for error in _check_file(entry)]
    if errors:
        raise SpecErrors(errors)
