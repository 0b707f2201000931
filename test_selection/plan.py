"""Stage 4: the plan — budget, always-run, spec modes, and shards by longest-processing-time."""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from test_selection.types import PLACE_SOURCES, Budget, PlannedTest, Scored, TestId

DEFAULT_TEST_SECONDS = 1.0


def load_durations(path: Path) -> dict[str, float]:
    """PyTorch's ``test-times.json`` shape: ``{config: {test_file: seconds}}`` (or one flat map).

    Keys are test file names without ``.py`` relative to ``test/`` (``test_ops``, ``nn/test_x``).
    """
    data: Any = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    merged: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            for name, seconds in value.items():
                if isinstance(seconds, int | float):
                    merged[name] = max(merged.get(name, 0.0), float(seconds))
        elif isinstance(value, int | float):
            merged[key] = float(value)
    return merged


def _file_key(path: str) -> str:
    return path.removeprefix("test/").removesuffix(".py")


def durations_for(
    tests: list[TestId], file_seconds: Mapping[str, float], learned: Mapping[TestId, float]
) -> dict[TestId, float]:
    """Per test: learned from our results, else its file's time split evenly, else a default."""
    per_file = Counter(t.file for t in tests)
    out: dict[TestId, float] = {}
    for test in tests:
        if test in learned:
            out[test] = learned[test]
        elif _file_key(test.file) in file_seconds:
            out[test] = file_seconds[_file_key(test.file)] / per_file[test.file]
        else:
            out[test] = DEFAULT_TEST_SECONDS
    return out


def _always(item: Scored) -> bool:
    return any(e.source == "always-run" and e.score > 0 for e in item.evidence)


def _reasons(item: Scored) -> list[str]:
    """The strongest reasons first; the coverage floor's or safe mode's (worth no score:
    they give a place in the plan, not a rank) lead when they are there."""
    if not item.evidence:
        return []
    placed = [e.reason for e in item.evidence if e.source in PLACE_SOURCES]
    ranked = [e.reason for e in sorted(item.evidence, key=lambda e: -e.score) if e.score > 0]
    return (placed + ranked)[:5]


@dataclass
class _Left:
    """What the budget holds: a count, seconds, and the seconds spent so far."""

    count: int
    seconds: float
    spent: float

    def fits(self, chosen: int, tests: int, cost: float) -> bool:
        return chosen + tests <= self.count and self.spent + cost <= self.seconds


def _place(
    scored: Mapping[TestId, Scored],
    durations: Mapping[TestId, float],
    chosen: list[Scored],
    taken: set[TestId],
    left: _Left,
    floor: Sequence[TestId],
    wholes: Sequence[Sequence[TestId]],
    budget: Budget,
    executed: Sequence[TestId] = (),
    executed_share: float = 0.0,
) -> list[str]:
    """The coverage floor test by test, most specific first, then the other executing tests
    in their order up to ``executed_share`` of the budget, then each whole group that still
    fits in full; appended to ``chosen``. Returns what to say of the floor's part that did
    not fit."""
    floor_out = _take_each(scored, durations, chosen, taken, left, floor)
    if executed_share > 0:  # up to this share of the budget's count and of its seconds
        share = (int(executed_share * left.count), executed_share * left.seconds)
        _take_each(scored, durations, chosen, taken, left, executed, *share)
    for group in wholes:
        missing = [test for test in group if test not in taken and test in scored]
        cost = sum(durations[test] for test in missing)
        if not left.fits(len(chosen), len(missing), cost):
            continue
        chosen += [scored[test] for test in missing]
        taken.update(missing)
        left.spent += cost
    if not floor_out:
        return []
    return [
        f"the coverage floor goes beyond the {budget} budget: its {floor_out} least "
        "specific test(s) did not fit (the most specific did); a larger budget runs them"
    ]


def _take_each(
    scored: Mapping[TestId, Scored],
    durations: Mapping[TestId, float],
    chosen: list[Scored],
    taken: set[TestId],
    left: _Left,
    tests: Sequence[TestId],
    count: float = float("inf"),
    seconds: float = float("inf"),
) -> int:
    """``tests`` in order, each while it fits what the budget has left and at most
    ``count`` of them in at most ``seconds``; appended to ``chosen``. Returns how many did
    not fit."""
    took, spent, out = 0, 0.0, 0
    for test in tests:
        if took >= count:
            break
        if test in taken or test not in scored:
            continue
        cost = durations[test]
        if spent + cost > seconds or not left.fits(len(chosen), 1, cost):
            out += 1
            continue
        chosen.append(scored[test])
        taken.add(test)
        left.spent += cost
        spent += cost
        took += 1
    return out


def make_plan(
    scored: dict[TestId, Scored],
    budget: Budget,
    durations: Mapping[TestId, float],
    shards: int,
    modes: Mapping[TestId, str] | None = None,
    floor: Sequence[TestId] = (),
    fill: bool = True,
    wholes: Sequence[Sequence[TestId]] = (),
    executed: Sequence[TestId] = (),
    executed_share: float = 0.0,
) -> tuple[list[PlannedTest], list[PlannedTest], list[list[str]], list[str]]:
    """Choose within the budget: always-run tests, then the tests the change edits or
    references, then the coverage floor (``floor``, most specific first), then ``executed``
    in order up to ``executed_share`` of the budget, then each group
    of ``wholes`` that still fits in full (a sweep's file), then by score (``fill``; without
    it the plan is those alone, as safe mode's is); LPT sharding of the chosen."""
    modes = modes or {}
    notes: list[str] = []
    score = {test: item.score for test, item in scored.items()}
    order = sorted(scored.values(), key=lambda s: (-score[s.test], s.test.sort_key))
    universe = len(order)
    if budget.kind == "all":
        limit_count, limit_seconds = universe, float("inf")
    elif budget.kind == "count":
        limit_count, limit_seconds = int(budget.value), float("inf")
    elif budget.kind == "fraction":
        limit_count, limit_seconds = max(1, round(universe * budget.value)), float("inf")
    else:
        limit_count, limit_seconds = universe, budget.value
    any_evidence = any(v > 0 for v in score.values())
    # the operator's always-run list is theirs to size; everything else fits the budget, the
    # tests the change edits or references first (by score), so a budget is never exceeded
    always = {s.test for s in order if _always(s)}
    must = {s.test for s in order if s.mandatory}  # each read once: the evidence lists are long
    chosen: list[Scored] = [s for s in order if s.test in always]
    spent = sum(durations[s.test] for s in chosen)
    if len(chosen) > limit_count or spent > limit_seconds:
        notes.append(f"{len(chosen)} always-run test(s) go beyond the {budget} budget")
    left_out = 0
    for item in order:
        if item.test not in must or item.test in always:
            continue
        cost = durations[item.test]
        if len(chosen) >= limit_count or spent + cost > limit_seconds:
            left_out += 1
            continue
        chosen.append(item)
        spent += cost
    if left_out:
        notes.append(
            f"{left_out} test(s) the change edits or references did not fit the {budget} "
            "budget (the highest-scored did); a larger budget runs them"
        )
    taken = {s.test for s in chosen}
    budget_left = _Left(limit_count, limit_seconds, spent)
    notes += _place(
        scored, durations, chosen, taken, budget_left, floor, wholes, budget, executed,
        executed_share,
    )  # fmt: skip
    spent = budget_left.spent
    for item in order if fill else ():
        if item.test in must or item.test in taken:
            continue
        if len(chosen) >= limit_count:
            break
        cost = durations[item.test]
        if spent + cost > limit_seconds:
            continue
        if score[item.test] <= 0 and budget.kind != "all" and any_evidence:
            # fill with zero-evidence tests only when nothing at all has evidence
            break
        chosen.append(item)
        spent += cost
    # never an empty plan, within the budget's count when it has one (safe mode's may be:
    # a change that reaches no test runs none)
    if not chosen and order and fill:
        chosen = order[: 1 if budget.kind == "seconds" else max(1, min(limit_count, universe))]
        if budget.kind == "seconds":
            notes.append(f"no test fits the {budget} budget: the top-ranked one runs alone")
    floor_ids = set(floor)
    if chosen and all(score[s.test] <= 0 and s.test not in floor_ids for s in chosen):
        notes.append(
            f"no test had evidence; {len(chosen)} test(s) run as a safety net within the budget"
        )
    chosen_ids = {s.test for s in chosen}

    def planned(item: Scored) -> PlannedTest:
        return PlannedTest(
            item.test,
            score[item.test],
            _reasons(item),
            list(item.evidence),
            durations[item.test],
            mode=modes.get(item.test),
        )

    selected = [planned(s) for s in chosen]
    excluded = [planned(s) for s in order if s.test not in chosen_ids]
    loads = [(0.0, i) for i in range(max(1, shards))]
    heapq.heapify(loads)
    shard_lists: list[list[str]] = [[] for _ in range(max(1, shards))]
    for test in sorted(selected, key=lambda p: (-p.duration, p.test.sort_key)):
        load, index = heapq.heappop(loads)
        test.shard = index
        shard_lists[index].append(test.test.nodeid)
        heapq.heappush(loads, (load + test.duration, index))
    return selected, excluded, shard_lists, notes
