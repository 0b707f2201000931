"""Spending the budget where the change reaches: a value for every test function.

A ranking orders test files; the budget is counted in test functions. Taking whole files
in rank order spends a large file's worth on one guess and leaves the next files unseen.
Instead every test gets the value of running it, in the same unit everywhere:

    value(test j of file f) = P(f is reached) x (E[edited tests | n_f] x share(j, n_f)
                                                 + FILE_WEIGHT if j is the file's first test)

- P(f is reached) is what the backtest measured for a file at f's rank under the chosen
  ranking (``Calibration.p_file``): a rank says how much to trust it, per repository.
- Within a file, tests are ordered by the change's words they use (rare words count more),
  and ``share(j, n)`` is the part of a file's edited tests the backtest found at that
  position: the first few tests of a file are worth more than the rest when the words
  point at them, and all alike when they do not.
- ``FILE_WEIGHT`` values reaching a file at all (one test of it runs), next to finding the
  exact tests inside it.

Sorting all tests by value and filling the budget is then the greedy answer to "most
expected finds for the tests run"; shares fall along a file, so a file's tests are taken
in its own order.

Where the repository's history says that spreading costs edited tests (a change that
edits many tests of one large file), the backtest picks the other rule, whole files in
rank order (``whole_file_values``), and says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

FILE_WEIGHT = 0.1  # chosen leave-one-repository-out on six histories (bench/README.md)
NO_EVIDENCE = -1  # the rank bucket of files a ranking gives no score at all
# the rules a plan spends its budget by: this module's values spread over files, whole files
# in rank order, or each test's chance from the test model (test_model.py)
SPREAD, WHOLE = "spread", "whole"
MODEL = "model"
# with a coverage map: the tests that executed a changed function first in their file, and
# also the files holding them moved up the ranking
REACHED_FIRST, REACHED_FILES = "reached-first", "reached-files"
_DECILES = 10


def rank_bucket(rank: int) -> int:
    """Half-octave buckets: ranks 0, 1, 2, 3, 4-5, 6-7, 8-10, ... share what they measured."""
    return int(2 * math.log2(rank + 1))


def size_bucket(tests: int) -> int:
    return int(math.log2(max(1, tests)))


@dataclass
class Calibration:
    """The backtest's measurements, as the numbers a plan needs (see the module docstring)."""

    hits: dict[int, float] = field(default_factory=dict)  # rank bucket -> files edited there
    seen: dict[int, float] = field(default_factory=dict)  # rank bucket -> files ranked there
    edited: dict[int, list[float]] = field(default_factory=dict)  # size -> [tests, files]
    coverage: list[float] = field(default_factory=list)  # share of edited tests by decile
    cases: int = 0
    # with a coverage map: the chance that a test which executed a changed function was
    # edited, in a file the change touched (None: the ranking does not use a map)
    reached: float | None = None
    _p: list[float] | None = field(default=None, repr=False, compare=False)
    _p_none: float = field(default=0.0, repr=False, compare=False)
    _shares: dict[int, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def prior(cls) -> Calibration:
        """For a repository with too little history to measure: a file's chance falls with
        its rank, a touched file has one edited test, words order a file weakly."""
        buckets = range(NO_EVIDENCE, 40)
        return cls(
            hits={b: 1.0 / (2 ** (b / 2) + 1) if b >= 0 else 0.002 for b in buckets},
            seen={b: 1.0 for b in buckets},
            edited={},
            coverage=[math.sqrt(d / _DECILES) for d in range(_DECILES + 1)],
        )

    def p_file(self, bucket: int) -> float:
        if self._p is None:
            self._p = self._fit_p()
        if bucket == NO_EVIDENCE or not self._p:
            return self._p_none
        return self._p[min(bucket, len(self._p) - 1)]

    def _fit_p(self) -> list[float]:
        """Chance per rank bucket, made non-increasing (a better rank is never trusted less)."""
        self._p_none = (self.hits.get(NO_EVIDENCE, 0.0) + 0.01) / (
            self.seen.get(NO_EVIDENCE, 0.0) + 1.0
        )
        last = max((b for b in self.seen if b >= 0), default=-1)
        rates = [
            (self.hits.get(b, 0.0) + 0.01) / (self.seen.get(b, 0.0) + 1.0) for b in range(last + 1)
        ]
        weights = [self.seen.get(b, 0.0) + 1.0 for b in range(last + 1)]
        return non_increasing(rates, weights)

    def expected_edited(self, tests: int) -> float:
        """Edited tests of a touched file of this size (pooled with all sizes when rare)."""
        total_tests = sum(v[0] for v in self.edited.values())
        total_files = sum(v[1] for v in self.edited.values())
        prior = (total_tests + 1.0) / (total_files + 1.0)
        own = self.edited.get(size_bucket(tests), [0.0, 0.0])
        return min(float(tests), (own[0] + 3 * prior) / (own[1] + 3))

    def shares(self, tests: int) -> Any:
        """Part of a file's edited tests found at each position of its within-file order
        (a numpy array, kept per file size)."""
        import numpy as np

        cached = self._shares.get(tests)
        if cached is None:
            cov = self.coverage or Calibration.prior().coverage
            at = np.interp(
                np.arange(tests + 1) / max(tests, 1), np.linspace(0, 1, _DECILES + 1), cov
            )
            cached = np.diff(at)
            self._shares[tests] = cached
        return cached.copy()

    def add_coverage(self, fractions: Iterable[float]) -> None:
        """Set the within-file curve from the positions (0..1) where edited tests were found;
        made concave (a share never grows along a file), so a file's tests keep its order."""
        points = sorted(fractions)
        cov = [0.0]
        for d in range(1, _DECILES + 1):
            found = sum(1 for x in points if x <= d / _DECILES)
            cov.append((found + d / _DECILES) / (len(points) + 1))
        cov[_DECILES] = 1.0
        steps = non_increasing([cov[i + 1] - cov[i] for i in range(_DECILES)], [1.0] * _DECILES)
        self.coverage = [0.0]
        for step in steps:
            self.coverage.append(self.coverage[-1] + step)


def non_increasing(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The closest non-increasing sequence (pool adjacent violators, weighted)."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for value, weight in zip(values, weights, strict=True):
        blocks.append([value * weight, weight, 1])
        while len(blocks) > 1 and blocks[-1][0] / blocks[-1][1] > blocks[-2][0] / blocks[-2][1]:
            total, w, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += w
            blocks[-1][2] += count
    out: list[float] = []
    for total, weight, count in blocks:
        out += [total / weight] * int(count)
    return out


def file_values(
    p_file: float,
    expected: float,
    tests: int,
    calibration: Calibration,
    file_weight: float = FILE_WEIGHT,
    reached: int = 0,
) -> Any:
    """The value of each position of a file's within-file order (falling along the file),
    as a numpy array. ``reached``: the order starts with this many tests that executed a
    changed function, each worth at least the measured chance that such a test is edited."""
    values = p_file * expected * calibration.shares(tests)
    if reached and calibration.reached is not None:
        import numpy as np

        k = min(reached, tests)
        values[:k] = np.maximum(values[:k], p_file * calibration.reached)
    if tests:
        values[0] += p_file * file_weight
    return values


def whole_file_values(p_file: float, rank: int, tests: int) -> Any:
    """The whole-files rule: a file's tests all worth its chance, a little less down the
    ranking and along the file, so the plan takes whole files in rank order (each in its
    word order) and the last one in part. The step along a file is a millionth of the step
    down the ranking, so a file of up to a million tests still ends above the next one."""
    import numpy as np

    return p_file * (1.0 - 1e-6 * rank) * (1.0 - 1e-12 * np.arange(tests))


def idf_order(
    tests: Sequence[tuple[frozenset[str], int]], words: frozenset[str]
) -> tuple[list[int], list[float]]:
    """A file's tests ordered by the change's words they use, rare words (in this file)
    counting more; then longer tests first (they are edited more often). Returns the order
    (indexes into ``tests``) and each test's word score."""
    if not words:
        scores = [0.0] * len(tests)
    else:
        frequency: dict[str, int] = {}
        for toks, _lines in tests:
            for word in toks & words:
                frequency[word] = frequency.get(word, 0) + 1
        n = len(tests)
        weight = {w: math.log((n + 1) / (c + 0.5)) for w, c in frequency.items()}
        scores = [sum(weight[w] for w in toks & words) for toks, _lines in tests]
    order = sorted(range(len(tests)), key=lambda i: (-scores[i], -tests[i][1], i))
    return order, scores
