"""Sweeps run whole: a test file most of whose tests the change reaches runs in full.

A change that renames or reworks a def used across a test file usually edits most of that
file's tests with it (a sweep). Ranking tests one by one spends the budget on a few of them
and leaves the rest; on the histories never tuned on, most missed edited tests sat in such
commits. So a file of at least ``MIN_TESTS`` tests of which at least ``SHARE`` executed a
changed function (by the coverage map) or name a changed def runs whole, when what the budget
has left holds it; the plan says which files and why. Whether a repository's plans do this is
the backtest's call (``ranking/choice.py``): it replays its chosen ranking with and without
sweeps on the repository's own recent commits and keeps sweeps only where they find more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from test_selection.change_analysis import ChangeAnalysis
from test_selection.coverage.select import CoverageUse
from test_selection.inventory import Inventory
from test_selection.types import TestId

SHARE = 0.5  # of a file's tests reaching the change, for the file to run whole
MIN_TESTS = 10  # smaller files are left to the ranking (a sweep edits ten tests or more)


def sweep_names(names: Iterable[str]) -> set[str]:
    """The changed names a test's use of counts: no test helpers, dunders, short names or
    constants (they are everywhere)."""
    return {n for n in names if not n.startswith(("test", "__")) and len(n) > 2 and not n.isupper()}


def is_sweep(reached: int, tests: int) -> bool:
    """Whether a file of ``tests`` tests, ``reached`` of which reach the change, runs whole."""
    return tests >= MIN_TESTS and reached >= SHARE * tests


@dataclass(frozen=True)
class Sweep:
    """A test file to run whole: its tests, and how many of them reach the change."""

    file: str
    tests: tuple[TestId, ...]
    reached: int

    @property
    def why(self) -> str:
        return (
            f"{self.reached} of the {len(self.tests)} tests of {self.file} reach the change "
            "(executed a changed function or name a changed def): the file runs whole"
        )


def sweeps(
    change: ChangeAnalysis,
    inventory: Inventory,
    universe: set[TestId],
    coverage: CoverageUse | None,
) -> list[Sweep]:
    """The files to run whole, the most reached share first (then the smaller file)."""
    names = sweep_names(change.names) | change.ops
    reach = set(coverage.reach) if coverage is not None else set()
    found = []
    for path, file in inventory.files.items():
        tests = [fn for fn in file.tests if fn.id in universe]
        if len(tests) < MIN_TESTS:
            continue
        reached = sum(1 for fn in tests if fn.id in reach or names.intersection(fn.references))
        if is_sweep(reached, len(tests)):
            found.append(Sweep(path, tuple(fn.id for fn in tests), reached))
    found.sort(key=lambda s: (-s.reached / len(s.tests), len(s.tests), s.file))
    return found
