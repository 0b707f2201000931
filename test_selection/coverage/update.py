"""Bringing a coverage map forward to a newer revision by running only what may have changed.

A test's record can only change if code it executed changed (or the test itself did): every
function it ran is in the map, by file. So from a map at revision A to revision B, the test
files to run again are those B changed, and those holding a test that executed a function
in a file B changed; every other test's record is kept as it was. Changes that reach tests
no function record shows run more again: a ``conftest.py`` every test file below its
folder, a change to pytest's own configuration everything. What this cannot see: a test
that reads a data file the change edited without calling changed code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from test_selection.coverage.map import CoverageMap
from test_selection.layout import below, conftest_scopes


@dataclass(frozen=True)
class Update:
    """What to run again (None: everything), what to keep, and why."""

    rerun: list[str] | None
    kept: dict[str, dict[tuple[str, str], int]]
    reason: str


def test_file(test: str) -> str:
    return test.split("::", 1)[0]


def plan_update(
    old: CoverageMap,
    changed: Iterable[str],
    test_files: set[str],
    is_test: Callable[[str], bool],
    settings_changed: str | None = None,
) -> Update:
    """The update from ``old`` given the paths changed since its revision, the test files
    of the new revision, and the configuration file whose pytest settings changed (if
    one did)."""
    changed = set(changed)
    if settings_changed:
        return Update(None, {}, f"pytest's settings in {settings_changed} changed: all run again")
    if old.collection_errors:
        return Update(None, {}, "the earlier map had collection errors: every test runs again")
    rerun = {p for p in changed if p in test_files and is_test(p)}
    for _conftest, folder in conftest_scopes(changed):
        rerun |= {t for t in test_files if below(folder, t)}
    code = {p for p in changed if p.endswith(".py")}
    for test, functions in old.tests.items():
        file = test_file(test)
        if file in test_files and file not in rerun and any(f in code for f, _q in functions):
            rerun.add(file)
    kept = {
        test: dict(functions)
        for test, functions in old.tests.items()
        if test_file(test) in test_files and test_file(test) not in rerun
    }
    return Update(
        sorted(rerun),
        kept,
        f"{len(rerun)} test file(s) run again (changed, or a test of them executed a changed "
        f"file), {len(kept)} test(s) kept from {old.revision[:12]}",
    )


def merged(fresh: CoverageMap, update: Update, old: CoverageMap) -> CoverageMap:
    """The fresh recording with the kept tests of the old map added (their flags too)."""
    for test, functions in update.kept.items():
        if test not in fresh.tests:
            fresh.add(test, functions, old.flags.get(test, ()))
    if fresh.collected is not None:
        fresh.collected += len(update.kept)
    fresh.reused = len(update.kept)
    fresh.reused_from = old.revision
    return fresh
