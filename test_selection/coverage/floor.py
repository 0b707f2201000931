"""The coverage floor: every changed function a map knows is reached by the plan.

Ranking alone outranks the tests that executed a changed function (issue 55: on histories
never tuned on, a quarter of breaking changes got no failing test in a 5 % plan although the
map held tests that ran the broken function). So before the budget is spent by rank, the
plan takes, for each changed function the map knows, its most specific executing test: the
one that executed the fewest recorded functions, then the shallowest call, then by name.
Then the other tests that executed a changed function (``Floor.executed``: each function's
second most specific, then third, ...), up to ``EXECUTED_SHARE`` of the budget: on a
breaking change they are the tests most likely to fail, and the map says so directly where
co-change only guesses. The ranking fills what the budget leaves. A floor larger than the
budget keeps its most specific part and says so (``plan.make_plan``).

With a map that recorded lines, a change confined to some statements of a function's body
puts the tests that executed those statements ahead of the function's other executing tests
(an off-by-one in one branch fails the tests that took that branch); a change to its header
(decorators, signature, docstring) counts as the whole function.

A map too far behind the change's base, or not behind it at all (recorded on another
branch), names functions that may no longer exist as recorded: no floor, with a note.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from test_selection.coverage.map import CoverageIndex, Function
from test_selection.types import TestId

PER_FUNCTION = 1  # the most specific executing tests taken per changed function
# of the budget the other executing tests may take (the ranking keeps the rest): measured in
# bench/README.md, "Executed tests first"
EXECUTED_SHARE = 0.5
STALE_AFTER = 1000  # commits from the map's revision to the base: older maps make no floor


@dataclass
class Floor:
    """What the floor takes for one change, most specific first, and what it could not."""

    tests: list[TestId] = field(default_factory=list)
    # the other tests that executed a changed function, in the order the plan takes them
    executed: list[TestId] = field(default_factory=list)
    taken_executed: int = 0  # how many of them the plan took (set by the plan stage)
    executed_share: float = EXECUTED_SHARE
    why: dict[TestId, str] = field(default_factory=dict)  # the function it is the floor for
    reached: list[str] = field(default_factory=list)  # changed functions a floor test ran
    unreached: list[str] = field(default_factory=list)  # known, but no universe test ran them
    unknown: list[str] = field(default_factory=list)  # the map never saw them
    skipped: str = ""  # why there is no floor at all

    def note(self) -> str:
        if self.skipped:
            return f"coverage floor: none ({self.skipped}); the ranking alone fills the budget"
        known = len(self.reached) + len(self.unreached)
        if not known and not self.unknown:
            return "coverage floor: none (the change changes no function of the code under test)"
        said = (
            f"coverage floor: {len(self.tests)} test(s) reach {len(self.reached)} of the "
            f"{known} changed function(s) the map knows, each by its most specific executing "
            "test, ahead of the ranking"
        )
        if self.unreached:
            said += f"; no test in the universe executed {_some(self.unreached)}"
        if self.executed:
            said += (
                f"; then {self.taken_executed} of the {len(self.executed)} other test(s) that "
                f"executed a changed function, most specific first (up to "
                f"{self.executed_share:.0%} of the budget)"
            )
        if self.unknown:
            said += f"; the map never saw {_some(self.unknown)}"
        return said

    def to_json(self) -> dict[str, Any]:
        return {
            "tests": [t.nodeid for t in self.tests],
            "executed": len(self.executed),
            "executed_taken": self.taken_executed,
            "reached": self.reached[:200],
            "unreached": self.unreached[:200],
            "unknown": self.unknown[:200],
            "skipped": self.skipped,
        }


def _how(statements: frozenset[int] | None, missed: int, depth: int, size: int) -> str:
    said = ["directly" if depth == 1 else f"{depth} calls deep"]
    if statements is not None:
        said.append("not the changed lines" if missed else "ran the changed lines")
    said.append(f"runs {size} recorded functions")
    return f" ({'; '.join(said)})"


def _some(names: list[str]) -> str:
    more = len(names) - 3
    return ", ".join(names[:3]) + (f" and {more} more" if more > 0 else "")


def stale(commits_behind: int | None, revision: str) -> str:
    """Why a map of ``revision`` this many commits behind the base makes no floor ('')."""
    if revision == "working-tree":
        return ""
    if commits_behind is None:
        return f"the map's revision {revision[:12]} is not an ancestor of the change's base"
    if commits_behind > STALE_AFTER:
        return (
            f"the map of {revision[:12]} is {commits_behind} commits behind the base "
            f"(more than {STALE_AFTER})"
        )
    return ""


def floor_for(
    index: CoverageIndex,
    targets: dict[str, list[Function]],
    changed: Iterable[str],
    universe: Iterable[TestId],
    lines: Mapping[str, frozenset[int]] | None = None,
) -> Floor:
    """The floor of a change whose known changed functions (``targets``: "file:qualname" ->
    the map's functions for it) are among ``changed``, over the tests of ``universe``;
    ``lines``: the changed statements' lines of the functions changed in their body alone."""
    by_id = {t.nodeid: t for t in universe}
    lines = lines or {}
    floor = Floor()
    taken: set[TestId] = set()
    rank: dict[TestId, tuple[int, int, int, str]] = {}
    # the rest: (missed the changed lines, place in its function, key)
    later: dict[TestId, tuple[int, int, int, int, str]] = {}
    for symbol in changed:
        functions = targets.get(symbol)
        if not functions:
            floor.unknown.append(symbol)
            continue
        runs: dict[str, tuple[int, int, int, str]] = {}
        statements = lines.get(symbol)
        for function in functions:
            for test, depth in index.by_function.get(function, ()):
                if test not in by_id:
                    continue
                missed = 0
                if statements is not None:
                    ran = index.lines_of(test, function[0])
                    missed = int(ran is not None and not ran & statements)
                key = (missed, index.size[test], depth, test)
                if test not in runs or key < runs[test]:
                    runs[test] = key
        if not runs:
            floor.unreached.append(symbol)
            continue
        floor.reached.append(symbol)
        ordered = sorted(runs, key=runs.__getitem__)
        for test in ordered[:PER_FUNCTION]:
            found = by_id[test]
            if found not in taken:
                taken.add(found)
                rank[found] = runs[test]
                missed, size, depth, _ = runs[test]
                floor.why[found] = (
                    f"the most specific test that executed changed {symbol}"
                    f"{_how(statements, missed, depth, size)}: the coverage floor"
                )
        for place, test in enumerate(ordered[PER_FUNCTION:], start=1):
            found = by_id[test]
            missed, size, depth, name = runs[test]
            at = (missed, place, size, depth, name)
            if found in taken:
                continue
            if found not in later or at < later[found]:
                later[found] = at
                floor.why[found] = (
                    f"executed changed {symbol}{_how(statements, missed, depth, size)}: "
                    "tests that executed a changed function go ahead of the ranking"
                )
    floor.tests = sorted(taken, key=rank.__getitem__)
    floor.executed = sorted((t for t in later if t not in taken), key=later.__getitem__)
    return floor
