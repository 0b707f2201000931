"""The test model (``test_model.py``) replayed on the backtest's commits.

Every replayed commit is planned with a model that never saw it: the commits are cut into
``FOLDS`` runs of neighbours, and each run's tests are given their chances by a model fitted
on the others. What the replay keeps per commit is, for each file the rankings put where
the budget can reach, its tests' chances best first, and where the commit's edited tests
sit in that order; the allocation then spends the budget on those chances exactly as the
plan will (``rules.take_best``), so the backtest compares the model with the words
order on equal terms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from test_selection.coverage.map import Reach
from test_selection.ranking.allocation import idf_order
from test_selection.ranking.test_model import (
    ChangeTerms,
    Reached,
    TestModel,
    TestText,
    file_features,
    fit_model,
)

FOLDS = 5
REACH_FILES = 3.0  # files are read down each ranking until this many budgets' worth of tests
MIN_FILES = 20  # ... and at least this many


def reached_tests(
    tests: Sequence[TestText], found: Mapping[str, Reach] | None
) -> list[Reached | None] | None:
    """What the map says of each test of a file (None: no map in this replay)."""
    if found is None:
        return None
    out: list[Reached | None] = []
    for t in tests:
        r = found.get(t.name)
        out.append(
            None
            if r is None
            else Reached(r.depth, r.executed, r.functions, r.function[1].rsplit(".", 1)[-1])
        )
    return out


def file_rows(
    tests: Sequence[TestText],
    terms: ChangeTerms,
    found: Mapping[str, Reach] | None,
) -> tuple[list[list[float]], list[int]]:
    """The model's rows for a file's tests under a change, and the file's words order."""
    order, scores = idf_order([(t.tokens, t.lines) for t in tests], terms.words)
    return file_features(tests, terms, scores, order, reached_tests(tests, found)), order


def chance_order(chances: Any, words_order: Sequence[int]) -> list[int]:
    """A file's tests by their chance, ties in the words order."""
    place = {i: k for k, i in enumerate(words_order)}
    return sorted(range(len(chances)), key=lambda i: (-float(chances[i]), place[i]))


@dataclass
class ModelReplay:
    """Per replayed commit: the chances of the tests of every file read (best first) and
    the places of its edited tests in that order; the model fitted on all of them."""

    chances: list[dict[str, Any]] = field(default_factory=list)
    edited: list[dict[str, tuple[int, ...]]] = field(default_factory=list)
    base: float = 0.0  # the chance of a test of a file not read (the edited share)
    model: TestModel | None = None


@dataclass(frozen=True)
class ReplayCase:
    """What the model replay needs of one backtest case (``backtest.Case``)."""

    terms: ChangeTerms
    texts: Mapping[str, Sequence[TestText]]  # its touched test files, as they were
    edited: Mapping[str, Sequence[int]]  # their edited tests (indexes into texts)
    reach: Mapping[str, Mapping[str, Reach]] | None  # test file -> test -> reach


def replay_model(
    cases: Sequence[ReplayCase],
    current: Mapping[str, Sequence[TestText]],
    read: Sequence[set[str]],
    coverage: bool,
    model: TestModel | None = None,
) -> ModelReplay | None:
    """Fit and replay the model (see the module docstring). ``read``: per case, the files
    whose tests get chances (the rest get the base chance). None when the cases hold too
    few edited tests to fit on. With ``model``: every case scored by that one, unfitted (a
    live plan's model, replayed on a past commit)."""
    import numpy as np

    rows: list[dict[str, list[list[float]]]] = []
    orders: list[dict[str, list[int]]] = []
    labels: list[list[int]] = []
    truth_rows: list[list[list[float]]] = []
    for case, files in zip(cases, read, strict=True):
        case_rows: dict[str, list[list[float]]] = {}
        case_orders: dict[str, list[int]] = {}
        for path in files | set(case.texts):
            tests = case.texts.get(path) or current.get(path) or ()
            if not tests:
                continue
            found = (case.reach or {}).get(path, {}) if coverage else None
            case_rows[path], case_orders[path] = file_rows(tests, case.terms, found)
        rows.append(case_rows)
        orders.append(case_orders)
        flat_rows: list[list[float]] = []
        flat_labels: list[int] = []
        for path, tests in case.texts.items():
            if path not in case_rows:
                continue
            hit = set(case.edited.get(path, ()))
            flat_rows += case_rows[path]
            flat_labels += [int(i in hit) for i in range(len(tests))]
        truth_rows.append(flat_rows)
        labels.append(flat_labels)
    every_row = [r for case in truth_rows for r in case]
    every_label = [y for case in labels for y in case]
    final = model or fit_model(every_row, every_label, coverage)
    if final is None:
        return None
    replay = ModelReplay(base=sum(every_label) / max(1, len(every_label)), model=final)
    n = len(cases)
    folds = [range(k * n // FOLDS, (k + 1) * n // FOLDS) for k in range(FOLDS)]
    for fold in folds if model is None else [range(n)]:
        if not fold:
            continue
        inside = set(fold)
        train_rows = [r for k in range(n) if k not in inside for r in truth_rows[k]]
        train_labels = [y for k in range(n) if k not in inside for y in labels[k]]
        scorer = model or fit_model(train_rows, train_labels, coverage) or final
        for k in fold:
            chances: dict[str, Any] = {}
            edited: dict[str, tuple[int, ...]] = {}
            for path, file_rows_ in rows[k].items():
                p = scorer.probabilities(file_rows_)
                order = chance_order(p, orders[k][path])
                chances[path] = np.asarray(p)[order]
                if path in cases[k].texts:
                    place = {i: j for j, i in enumerate(order)}
                    edited[path] = tuple(sorted(place[i] for i in cases[k].edited.get(path, ())))
            replay.chances.append(chances)
            replay.edited.append(edited)
    return replay


def files_to_read(
    orders: Sequence[Sequence[str]], sizes: Mapping[str, int], budget: float
) -> set[str]:
    """The files any of a case's rankings puts within ``REACH_FILES`` budgets of tests."""
    out: set[str] = set()
    for order in orders:
        spent = 0.0
        for k, path in enumerate(order):
            if spent > REACH_FILES * budget and k >= MIN_FILES:
                break
            out.add(path)
            spent += sizes.get(path, 0)
    return out
