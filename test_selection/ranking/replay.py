"""One ranking replayed over the backtest's cases: what the plan's budget would have found.

Each case is planned with the rank chances measured on the *other* cases (no case grades
itself), under one of the budget's rules (``allocation.py``: spread by value, whole files,
or the test model's per-test chances), and graded by the edited test files and edited tests
the counts take.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from test_selection.ranking import rules
from test_selection.ranking.allocation import (
    MODEL,
    NO_EVIDENCE,
    SPREAD,
    Calibration,
    rank_bucket,
    size_bucket,
)
from test_selection.ranking.cases import Case
from test_selection.ranking.model_replay import ModelReplay
from test_selection.ranking.rankers import FileScores
from test_selection.ranking.rules import FileSlot


def shared_calibration(
    cases: Sequence[Case], reached: Sequence[Mapping[str, int]] | None = None
) -> Calibration:
    """What does not depend on the ranking: edited tests per touched file by its size, and
    where in a file's word order the edited tests were. With ``reached`` (per case, how
    many tests of each file lead its order because they executed a changed function): how
    often such a test was edited."""
    calibration = Calibration()
    fractions: list[float] = []
    hit = total = 0
    for k, case in enumerate(cases):
        for path, (tests, edited) in case.truth.items():
            if not tests:
                continue
            entry = calibration.edited.setdefault(size_bucket(tests), [0.0, 0.0])
            entry[0] += len(edited)
            entry[1] += 1
            fractions += [(p + 0.5) / tests for p in edited]
            if reached is not None:
                first = min(tests, reached[k].get(path, 0))
                total += first
                hit += sum(1 for p in edited if p < first)
    calibration.add_coverage(fractions)
    calibration.cases = len(cases)
    if reached is not None:
        calibration.reached = (hit + 0.5) / (total + 1.0)
    return calibration


def ranked(scores: FileScores, files: Sequence[str]) -> list[str]:
    """The files best first; ties by path, so rankings are stable."""
    return sorted(files, key=lambda f: (-scores.scores.get(f, 0.0), f))


def buckets(scores: FileScores, order: Sequence[str]) -> dict[str, int]:
    """Each file's rank bucket (``order`` from :func:`ranked`); files the ranking gives
    nothing share the no-evidence one."""
    return {
        f: rank_bucket(r) if scores.scores.get(f, 0.0) > 0 else NO_EVIDENCE
        for r, f in enumerate(order)
    }


def case_slots(
    order: Sequence[str],
    file_buckets: Mapping[str, int],
    sizes: Mapping[str, int],
    calibration: Calibration,
    rule: str,
    reached: Mapping[str, int] | None = None,
    chances: Mapping[str, Any] | None = None,
    base: float = 0.0,
) -> list[FileSlot]:
    """Each file of a replayed commit as the rule sees it (``rules.FileSlot``), in rank
    order. Under the test model a file the replay did not read has the base chance for
    every test."""
    import numpy as np

    reached = reached or {}
    slots = []
    for rank, f in enumerate(order):
        if f not in file_buckets:
            continue
        n = sizes.get(f, 0)
        found = None
        if rule == MODEL:
            found = (chances or {}).get(f)
            if found is None or len(found) != n:
                found = np.full(n, base)
        p = calibration.p_file(file_buckets[f])
        slots.append(FileSlot(f, rank, p, n, reached.get(f, 0), found))
    return slots


def _swept(
    files: Sequence[str], ranked: Mapping[str, int], sizes: Mapping[str, int], budget: float
) -> dict[str, int]:
    """The sweep files taken whole, in order, while the budget holds each in full."""
    left = round(budget)
    out: dict[str, int] = {}
    for f in files:
        n = sizes.get(f, 0)
        if f in ranked and 0 < n <= left:
            out[f] = n
            left -= n
    return out


def plan_case(
    case: Case,
    order: Sequence[str],
    file_buckets: Mapping[str, int],
    sizes: Mapping[str, int],
    calibration: Calibration,
    fraction: float,
    file_weight: float,
    rule: str,
    reached: Mapping[str, int] | None = None,
    chances: Mapping[str, Any] | None = None,
    base: float = 0.0,
    sweeps: Sequence[str] = (),
) -> dict[str, int]:
    """How many tests of each file (in its own order) the plan takes for one replayed
    commit under ``rule``, spending ``fraction`` of the tests as they were before it: its
    sweeps whole first (while the budget holds each), then the rule's best values
    (``rules.py``, the live plan's own function). Under MODEL without ``chances`` (no test
    model could be fitted) the spread rule, as the live plan falls back to."""
    case_sizes = dict(sizes)
    case_sizes.update({f: n for f, (n, _e) in case.truth.items()})
    budget = fraction * sum(case_sizes.get(f, 0) for f in file_buckets)
    swept = _swept(sweeps, file_buckets, case_sizes, budget)
    budget -= sum(swept.values())
    rest = {f: b for f, b in file_buckets.items() if f not in swept}
    if rule == MODEL and chances is None:
        rule = SPREAD
    slots = case_slots(order, rest, case_sizes, calibration, rule, reached, chances, base)
    counts = rules.counts(rule, slots, calibration, budget, file_weight)
    counts.update(swept)
    return counts


def evaluate(
    ranked: list[tuple[list[str], dict[str, int]]],
    cases: Sequence[Case],
    sizes: Mapping[str, int],
    shared: Calibration,
    fraction: float,
    file_weight: float,
    allocation: str = SPREAD,
    reached: Sequence[Mapping[str, int]] | None = None,
    replay: ModelReplay | None = None,
    sweeps: Sequence[Sequence[str]] | None = None,
) -> tuple[float, float, Calibration]:
    """File and edited-test recall of one ranking over the cases, each case planned with
    the rank chances measured on the *other* cases (no case grades itself). ``reached``:
    per case, the tests of each file a coverage map puts first (``with_reach``);
    ``replay``: with allocation MODEL, the test model's chances per case; ``sweeps``: per
    case, the files to run whole first while the budget holds them (``case_sweeps``)."""
    hits: dict[int, float] = defaultdict(float)
    seen: dict[int, float] = defaultdict(float)
    own: list[tuple[dict[int, float], dict[int, float]]] = []
    for case, (_order, file_buckets) in zip(cases, ranked, strict=True):
        h: dict[int, float] = defaultdict(float)
        s: dict[int, float] = defaultdict(float)
        for f, b in file_buckets.items():
            s[b] += 1
            if f in case.truth:
                h[b] += 1
        own.append((h, s))
        for b, v in h.items():
            hits[b] += v
        for b, v in s.items():
            seen[b] += v
    found_files = truth_files = found_tests = truth_tests = 0
    for k, (case, (order, file_buckets), (h, s)) in enumerate(zip(cases, ranked, own, strict=True)):
        loo = Calibration(
            {b: hits[b] - h.get(b, 0.0) for b in hits},
            {b: seen[b] - s.get(b, 0.0) for b in seen},
            shared.edited,
            shared.coverage,
            reached=shared.reached,
        )
        positions = {f: edited for f, (_n, edited) in case.truth.items()}
        model = replay if allocation == MODEL else None
        counts = plan_case(
            case,
            order,
            file_buckets,
            sizes,
            loo,
            fraction,
            file_weight,
            allocation,
            reached[k] if reached is not None else None,
            model.chances[k] if model is not None else None,
            model.base if model is not None else 0.0,
            sweeps[k] if sweeps is not None else (),
        )
        if model is not None:
            positions.update(model.edited[k])
        for f, edited in positions.items():
            if f not in file_buckets:
                continue
            taken = counts.get(f, 0)
            truth_files += 1
            found_files += taken > 0
            truth_tests += len(edited)
            found_tests += sum(1 for p in edited if p < taken)
    full = Calibration(
        dict(hits),
        dict(seen),
        shared.edited,
        shared.coverage,
        cases=len(cases),
        reached=shared.reached,
    )
    return (
        found_files / truth_files if truth_files else 0.0,
        found_tests / truth_tests if truth_tests else 0.0,
        full,
    )
