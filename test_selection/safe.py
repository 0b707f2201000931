"""Safe mode: no budget, every test the change can be shown to reach, each with why.

A ranked plan trades misses for time. Safe mode does not: it takes every test that executed
a changed function in the coverage map; every test of a file the map does not know (a new
file, or no map at all) that imports a changed module or a name from it; the tests of such
a file that name a changed def; the tests that name a changed def the map never saw (new
code, module-level code); every test the change adds or edits; everything below a
changed ``conftest.py``; and everything when pytest's own settings changed. What it cannot
see: a test that reads a data file the change edited without calling changed code, or
reaches changed code only through a module its file does not import (the map sees those
when it knows the file).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from test_selection.change_analysis import ChangeAnalysis
from test_selection.coverage.select import CoverageUse
from test_selection.git import Repo
from test_selection.inventory import Inventory
from test_selection.layout import below, conftest_scopes, pytest_settings, settings_change
from test_selection.types import TestId

MODES = ("ranked", "safe")


@dataclass
class SafeSet:
    """The tests safe mode runs, in the order found, with why; and what it could not trace."""

    why: dict[TestId, str] = field(default_factory=dict)
    # changed files outside Python: traced only through the op names they change
    untraced: list[str] = field(default_factory=list)
    map_used: bool = False

    def add(self, tests: Iterable[TestId], reason: str) -> None:
        for test in tests:
            self.why.setdefault(test, reason)

    def notes(self, universe: int) -> list[str]:
        share = len(self.why) / universe if universe else 0.0
        said = [
            f"safe mode: {len(self.why)} of {universe} test(s) ({share:.1%}), no budget: every "
            "test the change reaches "
            + (
                "by the coverage map, and by import or name where the map cannot say"
                if self.map_used
                else "by import or name (no usable coverage map: a map narrows this)"
            )
        ]
        if self.untraced:
            more = len(self.untraced) - 3
            said.append(
                "safe mode: changed files outside Python are traced only through the op "
                "names they change: "
                + ", ".join(self.untraced[:3])
                + (f" and {more} more" if more > 0 else "")
            )
        return said


def modules_of(path: str) -> list[str]:
    """The dotted names a source file may be imported by: its path and every tail of it
    (``src/pkg/mod.py``: ``src.pkg.mod``, ``pkg.mod``, ``mod``), ``__init__`` as the package."""
    if not path.endswith(".py"):
        return []
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return [".".join(parts[k:]) for k in range(len(parts)) if parts[k:]]


def imports_module(imports: Iterable[str], modules: list[str]) -> bool:
    """Whether a file's imports name one of ``modules`` or a name in it (``import a.b``,
    ``from a.b import c``, ``from a import b``). Importing only a package above it is not
    counted: that would reach every module of the package (``import torch``); the tests of
    such a file are reached by the names they use instead."""
    return any(
        name == module or name.startswith(module + ".") for name in imports for module in modules
    )


def safe_set(
    repo: Repo,
    change: ChangeAnalysis,
    inventory: Inventory,
    universe: set[TestId],
    coverage: CoverageUse | None,
) -> SafeSet:
    """Every universe test safe mode runs for ``change`` (``coverage``: a usable map, or
    None), most certain reasons first."""
    found = SafeSet(map_used=coverage is not None)
    ordered = sorted(universe, key=lambda t: t.sort_key)
    edited = change.tests_added | change.tests_modified
    found.add((t for t in ordered if t in edited), "safe mode: the change adds or edits this test")
    settings = _settings_changed(repo, change)
    if settings:
        found.add(ordered, f"safe mode: pytest's settings in {settings} changed")
        return found
    for path, folder in conftest_scopes(f.path for f in change.files):
        found.add(
            (t for t in ordered if below(folder, t.file)), f"safe mode: below the changed {path}"
        )
    if coverage is not None:
        found.add(
            sorted(coverage.reach, key=lambda t: t.sort_key),
            "safe mode: executed a changed function in the coverage map",
        )
    _by_import_and_name(found, change, inventory, universe, coverage)
    return found


def _by_import_and_name(
    found: SafeSet,
    change: ChangeAnalysis,
    inventory: Inventory,
    universe: set[TestId],
    coverage: CoverageUse | None,
) -> None:
    """Where the map cannot say: files it does not know, by import or name; defs it never
    saw, by name."""
    mapped = (
        {t.split("::", 1)[0] for t in coverage.index.map.tests}
        if coverage is not None and coverage.index is not None
        else set()
    )
    unseen = (
        {s for s in coverage.changed if s not in coverage.known}
        if coverage is not None
        else set(change.symbols)
    )
    unseen_names = {s.rpartition(":")[2].rsplit(".", 1)[-1] for s in unseen}
    all_names = {n for n in change.names if not n.startswith("test")} | change.ops
    sources = change.source_files
    modules = [m for f in sources for p in (f.path, f.old_path) if p for m in modules_of(p)]
    for path, file in sorted(inventory.files.items()):
        tests = [fn for fn in file.tests if fn.id in universe]
        if not tests:
            continue
        if path not in mapped:
            if imports_module(file.imports, modules):
                found.add(
                    (fn.id for fn in tests),
                    "safe mode: its file imports a changed module"
                    + (" (a file the coverage map does not know)" if coverage is not None else ""),
                )
                continue
            named = [fn.id for fn in tests if all_names & set(fn.references)]
            found.add(
                named,
                "safe mode: names a changed def or op"
                + (" (a file the coverage map does not know)" if coverage is not None else ""),
            )
        else:
            named = [fn.id for fn in tests if unseen_names & set(fn.references)]
            found.add(named, "safe mode: names a changed def the coverage map never saw")
    found.untraced = [f.path for f in sources if not f.path.endswith(".py")]


def _settings_changed(repo: Repo, change: ChangeAnalysis) -> str | None:
    """The configuration file whose pytest settings the change alters, if one does."""
    return settings_change(pytest_settings(repo, change.base), pytest_settings(repo, change.head))
