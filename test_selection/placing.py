"""The plan stage: what takes a place before the ranking, then the budget.

A ranked plan takes, in this order, what the change edits or names (``plan.make_plan``),
the coverage floor (``coverage/floor.py``: each changed function's most specific test), the
sweeps that fit whole (``sweeps.py``), then the ranking's best until the budget is spent.
A safe plan (``safe.py``) takes every test the change can be shown to reach, and no budget.
Each test so placed says why; the notes say what each rule took and what it could not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from test_selection.change_analysis import ChangeAnalysis
from test_selection.coverage.floor import EXECUTED_SHARE, Floor, floor_for, stale
from test_selection.coverage.select import CoverageUse
from test_selection.git import Repo
from test_selection.inventory import Inventory
from test_selection.plan import make_plan
from test_selection.safe import safe_set
from test_selection.sweeps import Sweep, sweeps
from test_selection.types import (
    FLOOR_SOURCE,
    SAFE_SOURCE,
    SWEEP_SOURCE,
    Budget,
    Evidence,
    PlannedTest,
    Scored,
    TestId,
)


@dataclass
class PlanInputs:
    """What the plan stage reads: the scored universe, its costs and modes, the shards to
    fill, and the change with what is known of it."""

    scored: dict[TestId, Scored]
    durations: Mapping[TestId, float]
    modes: Mapping[TestId, str]
    shards: int
    change: ChangeAnalysis
    inventory: Inventory
    universe: set[TestId]
    coverage: CoverageUse | None


@dataclass
class Placed:
    """The plan stage's answer."""

    selected: list[PlannedTest]
    excluded: list[PlannedTest]
    shards: list[list[str]]
    notes: list[str] = field(default_factory=list)
    floor: Floor | None = None


def ranked_plan(
    inputs: PlanInputs,
    budget: Budget,
    use_floor: bool,
    use_sweeps: bool,
    executed_share: float = EXECUTED_SHARE,
) -> Placed:
    """The budget spent: the floor, the other executing tests up to ``executed_share`` of
    it, the sweeps, then by rank."""
    coverage = inputs.coverage
    floor = _floor(coverage, inputs.universe, inputs.scored) if coverage and use_floor else None
    if floor is not None:
        floor.executed_share = executed_share
    whole = sweeps(inputs.change, inputs.inventory, inputs.universe, coverage) if use_sweeps else []
    selected, excluded, shards, notes = make_plan(
        inputs.scored,
        budget,
        inputs.durations,
        inputs.shards,
        inputs.modes,
        floor.tests if floor else (),
        wholes=[s.tests for s in whole],
        executed=floor.executed if floor else (),
        executed_share=executed_share,
    )
    if floor is not None:
        _executed(floor, selected, inputs.scored)
    for item in selected:
        item.evidence.append(Evidence("plan", "budget", 0.0, f"within the {budget} budget"))
    said = ([floor.note()] if floor is not None else []) + _swept(whole, selected)
    return Placed(selected, excluded, shards, [*said, *notes], floor)


def safe_plan(repo: Repo, inputs: PlanInputs) -> Placed:
    """No budget: every test the change can be shown to reach (a map that cannot vouch for
    the change is not read)."""
    coverage = inputs.coverage
    usable = coverage if coverage is not None and not _stale(coverage) else None
    found = safe_set(repo, inputs.change, inputs.inventory, inputs.universe, usable)
    for test, why in found.why.items():
        inputs.scored[test].evidence.append(Evidence("plan", SAFE_SOURCE, 0.0, why))
    selected, excluded, shards, notes = make_plan(
        inputs.scored,
        Budget("all"),
        inputs.durations,
        inputs.shards,
        inputs.modes,
        list(found.why),
        fill=False,
    )
    return Placed(selected, excluded, shards, [*found.notes(len(inputs.universe)), *notes])


def _executed(floor: Floor, selected: list[PlannedTest], scored: dict[TestId, Scored]) -> None:
    """The executing tests past the floor that the plan took for that reason (not those the
    change edits or names, which go first anyway): each says why, the floor counts them."""
    later = set(floor.executed)
    for item in selected:
        if item.test not in later or scored[item.test].mandatory:
            continue
        floor.taken_executed += 1
        why = floor.why[item.test]
        item.evidence.append(Evidence("plan", FLOOR_SOURCE, 0.0, why))
        item.reasons.insert(0, why)
        del item.reasons[5:]


def _swept(whole: list[Sweep], selected: list[PlannedTest]) -> list[str]:
    """The sweeps the plan ran whole: each test says why, the notes say which."""
    chosen = {p.test: p for p in selected}
    ran = [s for s in whole if all(t in chosen for t in s.tests)]
    for sweep in ran:
        for test in sweep.tests:
            item = chosen[test]
            item.evidence.append(Evidence("plan", SWEEP_SOURCE, 0.0, sweep.why))
            item.reasons.insert(0, sweep.why)
            del item.reasons[5:]
    if not whole:
        return []
    said = [f"{s.file} ({s.reached} of {len(s.tests)})" for s in ran[:5]]
    return [
        f"sweeps: {len(ran)} of {len(whole)} test file(s) most of whose tests reach the change "
        "run whole"
        + (f": {', '.join(said)}" if said else "")
        + (f"; {len(whole) - len(ran)} did not fit the budget" if len(ran) < len(whole) else "")
    ]


def _stale(coverage: CoverageUse) -> str:
    """Why the map cannot vouch for this change ('' when it can)."""
    if coverage.index is None:
        return "the map was not read"
    return stale(coverage.commits_behind, coverage.revision)


def _floor(coverage: CoverageUse, universe: set[TestId], scored: dict[TestId, Scored]) -> Floor:
    """The coverage floor (``coverage/floor.py``): each known changed function's most
    specific executing test, with why, unless the map is too far from the change."""
    why_not = _stale(coverage)
    if why_not or coverage.index is None:
        return Floor(skipped=why_not)
    floor = floor_for(coverage.index, coverage.targets, coverage.changed, universe, coverage.lines)
    for test in floor.tests:  # the rest of floor.why: only for those the plan takes
        scored[test].evidence.append(Evidence("plan", FLOOR_SOURCE, 0.0, floor.why[test]))
    return floor
