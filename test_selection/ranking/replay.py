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

from test_selection.ranking.allocation import (
    FILE_WEIGHT,
    MODEL,
    NO_EVIDENCE,
    SPREAD,
    WHOLE,
    Calibration,
    file_values,
    rank_bucket,
    size_bucket,
)
from test_selection.ranking.cases import Case
from test_selection.ranking.model_replay import ModelReplay
from test_selection.ranking.rankers import (
    FileScores,
)


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


def allocate_counts(
    file_buckets: Mapping[str, int],
    sizes: Mapping[str, int],
    calibration: Calibration,
    budget: float,
    file_weight: float = FILE_WEIGHT,
    reached: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """How many of each file's tests (in its own order) the budget takes: the plan's rule
    (``allocation.py``), answered in counts for the backtest."""

    reached = reached or {}
    per_file: list[tuple[str, Any]] = []
    for f, bucket in file_buckets.items():
        n = sizes.get(f, 0)
        if n <= 0:
            continue
        p = calibration.p_file(bucket)
        per_file.append(
            (
                f,
                file_values(
                    p, calibration.expected_edited(n), n, calibration, file_weight,
                    reached.get(f, 0),
                ),
            )
        )  # fmt: skip
    return take_best(per_file, budget)


def take_best(per_file: Sequence[tuple[str, Any]], budget: float) -> dict[str, int]:
    """How many of each file's tests the best ``budget`` values take, for values that fall
    along each file (so a file's share is a prefix of its order); ties go by path, as in
    the plan."""
    import numpy as np

    if not per_file:
        return {}
    values = np.concatenate([v for _, v in per_file])
    take = round(budget)
    if take <= 0:
        return {}
    if take >= len(values):
        return {f: len(v) for f, v in per_file}
    threshold = np.partition(values, len(values) - take)[len(values) - take]
    counts: dict[str, int] = {}
    tied: list[tuple[str, int]] = []
    for f, v in per_file:
        # values fall along a file: those above the threshold are a prefix, then the ties
        above = int(np.searchsorted(-v, -threshold, side="left"))
        at = int(np.searchsorted(-v, -threshold, side="right")) - above
        if above:
            counts[f] = above
        if at:
            tied.append((f, at))
    left = take - sum(counts.values())
    for f, at in sorted(tied):  # the plan breaks ties by path, so does the replay
        if left <= 0:
            break
        counts[f] = counts.get(f, 0) + min(at, left)
        left -= at
    return counts


def model_counts(
    file_buckets: Mapping[str, int],
    sizes: Mapping[str, int],
    calibration: Calibration,
    budget: float,
    file_weight: float,
    replay: ModelReplay,
    case: int,
) -> dict[str, int]:
    """What the plan takes under the test model: each test worth its file's chance times
    its own, the file's first test also ``file_weight`` times the file's chance; a file the
    replay did not read has the base chance for every test."""
    import numpy as np

    chances = replay.chances[case]
    per_file: list[tuple[str, Any]] = []
    for f, bucket in file_buckets.items():
        n = sizes.get(f, 0)
        if n <= 0:
            continue
        p = calibration.p_file(bucket)
        found = chances.get(f)
        values = p * (found if found is not None and len(found) == n else np.full(n, replay.base))
        values[0] += p * file_weight
        per_file.append((f, values))
    return take_best(per_file, budget)


def whole_counts(order: Sequence[str], sizes: Mapping[str, int], budget: float) -> dict[str, int]:
    """Whole files in rank order until the budget is spent (the last one in part): what the
    plan takes under the whole-files rule."""
    left = round(budget)
    counts: dict[str, int] = {}
    for f in order:
        if left <= 0:
            break
        take = min(sizes.get(f, 0), left)
        if take:
            counts[f] = take
            left -= take
    return counts


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
        case_sizes = dict(sizes)
        case_sizes.update({f: n for f, (n, _e) in case.truth.items()})
        total = sum(case_sizes.get(f, 0) for f in file_buckets)
        positions = {f: edited for f, (_n, edited) in case.truth.items()}
        budget = fraction * total
        swept = _swept(sweeps[k] if sweeps is not None else (), file_buckets, case_sizes, budget)
        budget -= sum(swept.values())
        rest = {f: b for f, b in file_buckets.items() if f not in swept}
        if allocation == WHOLE:
            counts = whole_counts([f for f in order if f not in swept], case_sizes, budget)
        elif allocation == MODEL and replay is not None:
            counts = model_counts(rest, case_sizes, loo, budget, file_weight, replay, k)
            positions.update(replay.edited[k])
        else:
            counts = allocate_counts(
                rest,
                case_sizes,
                loo,
                budget,
                file_weight,
                reached[k] if reached is not None else None,
            )
        counts.update(swept)
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
