"""Bringing a coverage map forward to a newer revision by running only what may have changed.

A test's record can only change if code it executed changed (or the test itself did): every
function it ran is in the map. So from a map at revision A to revision B, the test files to
run again are those B changed, and those holding a test that executed a function whose body
B changed (as pytest-testmon does, by comparing each function between the two revisions,
here by its parsed form); every other test's record is kept as it was. A change that is not
confined to function bodies (a module-level statement, a class attribute, a def's signature
or decorators, a file that does not parse) counts as a change to every function of its
file. Changes that reach tests no function record shows run more again: a ``conftest.py``
every test file below its folder, a change to pytest's own configuration everything. What
this cannot see: a test that reads a data file the change edited without calling changed
code.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from test_selection.change_analysis import changed_symbols
from test_selection.coverage.map import CoverageMap
from test_selection.git import Repo
from test_selection.layout import below, conftest_scopes


@dataclass(frozen=True)
class Update:
    """What to run again (None: everything), what to keep, and why."""

    rerun: list[str] | None
    kept: dict[str, dict[tuple[str, str], int]]
    reason: str
    changed: frozenset[str] = frozenset()  # paths changed since the old map's revision


def test_file(test: str) -> str:
    return test.split("::", 1)[0]


def _skeleton(tree: ast.Module) -> str:
    """The module with every function body emptied: what must be equal for a change to be
    confined to function bodies."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.body = [ast.Pass()]
    return ast.dump(tree)


def changed_bodies(path: str, old: bytes | None, new: bytes | None) -> set[str] | None:
    """The qualified names of the defs of one Python file whose bodies differ between two
    versions, or None when the change is not confined to function bodies (see the module
    docstring): then every function of the file counts as changed."""
    if old is None or new is None:
        return None
    try:
        before, after = ast.parse(old, filename=path), ast.parse(new, filename=path)
    except (SyntaxError, ValueError):
        return None
    if _skeleton(before) != _skeleton(after):
        return None
    return changed_symbols(path, old, new)


def changes_between(repo: Repo, old: str, new: str) -> tuple[list[str], dict[str, set[str] | None]]:
    """The paths changed from ``old`` to ``new`` and, per Python file among them, the defs
    whose bodies alone changed (``changed_bodies``), both versions read in one batch."""
    raw = repo.text(
        "diff", "--raw", "-z", "--no-abbrev", "--no-renames", "--end-of-options", old, new
    ).split("\0")  # fmt: skip
    # ":MODE MODE OLD NEW STATUS" then the path
    blobs = {
        path: (meta.split()[2], meta.split()[3])
        for meta, path in zip(raw[0::2], raw[1::2], strict=False)
        if meta.startswith(":") and path
    }
    wanted = [b for p, pair in blobs.items() if p.endswith(".py") for b in pair if b.strip("0")]
    contents = repo.read_blobs(sorted(set(wanted)))
    bodies = {
        p: changed_bodies(p, contents.get(pair[0]), contents.get(pair[1]))
        for p, pair in blobs.items()
        if p.endswith(".py")
    }
    return list(blobs), bodies


def _executed_changed(qualname: str, names: set[str]) -> bool:
    """Whether a recorded function is one of the changed defs or nested in one."""
    return qualname in names or any(qualname.startswith(name + ".") for name in names)


def plan_update(
    old: CoverageMap,
    changed: Iterable[str],
    test_files: set[str],
    is_test: Callable[[str], bool],
    settings_changed: str | None = None,
    bodies: Mapping[str, set[str] | None] | None = None,
) -> Update:
    """The update from ``old`` given the paths changed since its revision, the test files
    of the new revision, the configuration file whose pytest settings changed (if one
    did), and per changed Python file the defs whose bodies alone changed
    (``changed_bodies``; a file missing or None: all of its functions)."""
    changed = set(changed)
    if settings_changed:
        return Update(None, {}, f"pytest's settings in {settings_changed} changed: all run again")
    if old.collection_errors:
        return Update(None, {}, "the earlier map had collection errors: every test runs again")
    rerun = {p for p in changed if p in test_files and is_test(p)}
    for _conftest, folder in conftest_scopes(changed):
        rerun |= {t for t in test_files if below(folder, t)}
    code = {p for p in changed if p.endswith(".py")}
    bodies = bodies or {}

    def touched(function: tuple[str, str]) -> bool:
        path, qualname = function
        if path not in code:
            return False
        names = bodies.get(path)
        return names is None or _executed_changed(qualname, names)

    narrowed = sum(1 for p in code if bodies.get(p) is not None)
    for test, functions in old.tests.items():
        file = test_file(test)
        if file in test_files and file not in rerun and any(map(touched, functions)):
            rerun.add(file)
    kept = {
        test: dict(functions)
        for test, functions in old.tests.items()
        if test_file(test) in test_files and test_file(test) not in rerun
    }
    return Update(
        sorted(rerun),
        kept,
        changed=frozenset(changed),
        reason=f"{len(rerun)} test file(s) run again (changed, or a test of them executed a "
        f"changed function), {len(kept)} test(s) kept from {old.revision[:12]}"
        + (
            f"; {narrowed} of the {len(code)} changed Python file(s) changed function bodies "
            "only (the rest count as changed in every function)"
            if code
            else ""
        ),
    )


def merged(fresh: CoverageMap, update: Update, old: CoverageMap) -> CoverageMap:
    """The fresh recording with the kept tests of the old map added (their flags too, and
    their lines unless the change touched a file they ran lines of: there the numbers may
    have moved, and the map then does not know the test's lines)."""
    for test, functions in update.kept.items():
        if test not in fresh.tests:
            lines = old.lines.get(test)
            if lines is not None and not update.changed.isdisjoint(lines):
                lines = None
            fresh.add(test, functions, old.flags.get(test, ()), lines)
    if fresh.collected is not None:
        fresh.collected += len(update.kept)
    fresh.reused = len(update.kept)
    fresh.reused_from = old.revision
    return fresh
