"""The budget rules, each one value function, shared by the backtest's replay and the plan.

A rule gives every position of a test file's own order a value (``allocation.py`` says what
the values mean); the budget takes the best values across files. The replay (``replay.py``)
counts what that takes of each file on a past commit; the live change (``live.py``) gives
each test its value and the plan takes the best. Both call :func:`values` on a
:class:`FileSlot` (one test file as the rule sees it), so the plan a live change gets is the
one the backtest measured for its candidate (``tests/test_replay_live.py`` holds them to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from test_selection.ranking.allocation import (
    MODEL,
    WHOLE,
    Calibration,
    file_values,
    whole_file_values,
)


@dataclass(frozen=True)
class FileSlot:
    """One test file as a rule sees it: its place in the ranking, its chance of being
    reached, how many tests it has, how many lead its order because they executed a changed
    function (a map's candidates), and under the test model each test's chance, best first."""

    path: str
    rank: int
    p_file: float
    tests: int
    reached: int = 0
    chances: Any = None  # numpy array of ``tests`` chances (MODEL only)


def values(rule: str, slot: FileSlot, calibration: Calibration, file_weight: float) -> Any:
    """The value of each position of the file's order (a numpy array falling along it:
    rounding may not raise a later position above an earlier one, or the budget, which
    takes a prefix of each file, would stop short at a tie)."""
    import numpy as np

    return np.minimum.accumulate(_values(rule, slot, calibration, file_weight))


def _values(rule: str, slot: FileSlot, calibration: Calibration, file_weight: float) -> Any:
    if rule == WHOLE:
        return whole_file_values(slot.p_file, slot.rank, slot.tests)
    if rule == MODEL:
        found = slot.p_file * slot.chances
        found[0] += slot.p_file * file_weight
        return found
    return file_values(
        slot.p_file,
        calibration.expected_edited(slot.tests),
        slot.tests,
        calibration,
        file_weight,
        slot.reached,
    )


def counts(
    rule: str,
    slots: Sequence[FileSlot],
    calibration: Calibration,
    budget: float,
    file_weight: float,
) -> dict[str, int]:
    """How many of each file's tests (in its own order) the budget takes under ``rule``."""
    return take_best(
        [(s.path, values(rule, s, calibration, file_weight)) for s in slots if s.tests > 0],
        budget,
    )


def take_best(per_file: Sequence[tuple[str, Any]], budget: float) -> dict[str, int]:
    """How many of each file's tests the best ``budget`` values take, for values that fall
    along each file (so a file's share is a prefix of its order); ties go by path, as in
    the plan."""
    import numpy as np

    if not per_file:
        return {}
    flat = np.concatenate([v for _, v in per_file])
    take = round(budget)
    if take <= 0:
        return {}
    if take >= len(flat):
        return {f: len(v) for f, v in per_file}
    threshold = np.partition(flat, len(flat) - take)[len(flat) - take]
    out: dict[str, int] = {}
    tied: list[tuple[str, int]] = []
    for f, v in per_file:
        # values fall along a file: those above the threshold are a prefix, then the ties
        above = int(np.searchsorted(-v, -threshold, side="left"))
        at = int(np.searchsorted(-v, -threshold, side="right")) - above
        if above:
            out[f] = above
        if at:
            tied.append((f, at))
    left = take - sum(out.values())
    for f, at in sorted(tied):  # the plan breaks ties by path, so does the replay
        if left <= 0:
            break
        out[f] = out.get(f, 0) + min(at, left)
        left -= at
    return out
