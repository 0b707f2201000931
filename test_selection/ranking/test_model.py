"""The chance that a change edits one test, given that it touches the test's file.

Inside a file the plan must decide two things: which tests come first, and how deep into
the file the budget goes before the next file's first tests are worth more. The words
order (``allocation.idf_order``) answers the first with one signal and the second with a
curve pooled over every file of the repository. This model answers both per test: a
logistic regression over what a test shares with the change, fitted per repository on the
backtest's own past commits (the tests of every file those commits touched, labelled by
whether the commit edited them), so its probabilities are in the same unit everywhere and
a file whose tests the change names many times is read deeper than one it names once.

What it reads of a test (``FEATURES``): the change's words in its body (their share of the
file's best, and its place in the words order), its name against the names of the defs
and classes the change touches, those names called in its body, names the change removed
used in its body, its length, its file's size, the best name match in its class; with a
coverage map also whether it executed a changed function, how specifically, how many of
them, and whether the function's name is in the test's name. Logistic regression, so every
plan can say which of these counted and by how much.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from test_selection.test_bodies import _IDENT, _parts, _with_parts

FORMAT = 1
FEATURES = (
    "the change's words in it (share of its file's best)",
    "its place in its file by the change's words",
    "its name shares a changed def's name",
    "it calls a changed def by name",
    "it uses a name the change removed",
    "its length",
    "tests in its file",
    "its class's best name match",
)
COVERAGE_FEATURES = (
    "it executed a changed function",
    "it called the changed function directly (1 / calls deep)",
    "functions it runs in all (fewer: more specific)",
    "changed functions it executed",
    "the executed function's name is in its name",
)
MIN_POSITIVES = 20  # edited tests in the backtest's touched files needed to fit
MAX_ROWS = 60_000  # more rows than this: negatives are sampled (and weighted back)
_DEF = re.compile(r"\b(?:def|class)[ \t]+([A-Za-z_]\w*)")
_NAME_STOP = frozenset({"test", "tests", "testcase"})


@dataclass(frozen=True)
class ChangeTerms:
    """What a change says that a test can share: the words of its lines (the words
    order's), the defs and classes it touches (named in its hunk headers or changed lines),
    the words in those names, and the identifiers its removed lines had and its added lines
    do not (a renamed argument, a removed function)."""

    words: frozenset[str]
    defs: frozenset[str]
    def_words: frozenset[str]
    vanished: frozenset[str]


def change_terms(
    words: frozenset[str],
    contexts: Iterable[str],
    removed: Iterable[str],
    added: Iterable[str],
) -> ChangeTerms:
    """The terms of a change from its hunk headers and changed lines (the same reading for a
    live change and a replayed one)."""
    removed, added = list(removed), list(added)
    defs: set[str] = set()
    for line in [*contexts, *removed, *added]:
        defs.update(_DEF.findall(line))
    gone = {w for line in removed for w in _IDENT.findall(line)}
    gone -= {w for line in added for w in _IDENT.findall(line)}
    return ChangeTerms(
        words,
        frozenset(defs),
        frozenset(w for w in _with_parts(defs) if len(w) > 2),
        frozenset(gone),
    )


@dataclass(frozen=True)
class TestText:
    """What the model reads of one test: its name (``Class::test``), tokens and length."""

    __test__ = False

    name: str
    tokens: frozenset[str]
    lines: int


def name_words(name: str) -> frozenset[str]:
    """The words of a test's class and function names (``TestChunked::test_short_input``:
    chunked, short, input), without the word test."""
    out: set[str] = set()
    for part in name.split("::"):
        out.add(part.lower())
        out.update(_parts(part))
    return frozenset(out - _NAME_STOP)


@dataclass(frozen=True)
class Reached:
    """What a coverage map says of one test for one change (``coverage_map.Reach``, plus how
    many of the change's functions it executed)."""

    depth: int  # calls from the test to the changed function
    executed: int  # functions the test runs in all
    functions: int  # changed functions it executed
    function_name: str


def _idf(sets: Sequence[frozenset[str]], terms: frozenset[str]) -> list[float]:
    if not terms:
        return [0.0] * len(sets)
    hits = [s & terms for s in sets]
    frequency: dict[str, int] = {}
    for hit in hits:
        for word in hit:
            frequency[word] = frequency.get(word, 0) + 1
    n = len(sets)
    weight = {w: math.log((n + 1) / (c + 0.5)) for w, c in frequency.items()}
    return [sum(weight[w] for w in hit) for hit in hits]


def file_features(
    tests: Sequence[TestText],
    terms: ChangeTerms,
    word_scores: Sequence[float],
    word_order: Sequence[int],
    reached: Sequence[Reached | None] | None = None,
) -> list[list[float]]:
    """One row per test of a file (``FEATURES``, then ``COVERAGE_FEATURES`` when
    ``reached`` is given). ``word_scores`` and ``word_order``: the file's words order
    (``idf_order``), computed once by the caller."""
    n = len(tests)
    if not n:
        return []
    best = max(word_scores) or 1.0
    place = [0.0] * n
    for k, i in enumerate(word_order):
        place[i] = k / n
    names = [name_words(t.name) for t in tests]
    by_name = _idf(names, terms.def_words)
    calls = _idf([t.tokens for t in tests], terms.defs)
    gone = _idf([t.tokens for t in tests], terms.vanished)
    classes: dict[str, float] = {}
    for t, value in zip(tests, by_name, strict=True):
        cls = t.name.rpartition("::")[0]
        if cls:
            classes[cls] = max(classes.get(cls, 0.0), value)
    size = math.log(n)
    rows = []
    for i, t in enumerate(tests):
        cls = t.name.rpartition("::")[0]
        row = [
            word_scores[i] / best,
            place[i],
            math.log1p(by_name[i]),
            math.log1p(calls[i]),
            math.log1p(gone[i]),
            math.log1p(t.lines),
            size,
            math.log1p(classes.get(cls, 0.0)) if cls else 0.0,
        ]
        if reached is not None:
            r = reached[i]
            if r is None:
                row += [0.0, 0.0, 0.0, 0.0, 0.0]
            else:
                short = set(_parts(r.function_name)) | {r.function_name.lower()}
                row += [
                    1.0,
                    1.0 / max(1, r.depth),
                    math.log1p(r.executed),
                    math.log1p(r.functions),
                    1.0 if short & names[i] else 0.0,
                ]
        rows.append(row)
    return rows


@dataclass
class TestModel:
    """A fitted model as plain numbers (what a plan needs to use and explain it)."""

    __test__ = False

    mean: list[float]
    scale: list[float]
    coef: list[float]
    intercept: float
    positives: int
    rows: int
    coverage: bool  # reads COVERAGE_FEATURES too
    format: int = FORMAT

    @property
    def features(self) -> tuple[str, ...]:
        return FEATURES + (COVERAGE_FEATURES if self.coverage else ())

    def probabilities(self, rows: Sequence[Sequence[float]]) -> Any:
        """P(edited | its file is touched) per row, as a numpy array."""
        import numpy as np

        if not len(rows):
            return np.zeros(0)
        x = (np.asarray(rows, dtype=float) - np.asarray(self.mean)) / np.asarray(self.scale)
        z = np.clip(x @ np.asarray(self.coef) + self.intercept, -60.0, 60.0)
        return 1.0 / (1.0 + np.exp(-z))

    def strongest(self, row: Sequence[float], top: int = 2) -> list[str]:
        """The features that raised this test's chance most, for its reason."""
        parts = [
            ((value - mean) / scale * weight, name)
            for value, mean, scale, weight, name in zip(
                row, self.mean, self.scale, self.coef, self.features, strict=True
            )
        ]
        return [name for value, name in sorted(parts, reverse=True)[:top] if value > 0.1]


def fit_model(
    rows: Sequence[Sequence[float]], labels: Sequence[int], coverage: bool, seed: int = 0
) -> TestModel | None:
    """A logistic regression on the rows (None with fewer than ``MIN_POSITIVES`` edited
    tests). Unweighted, so its output is a probability a plan can spend the budget with;
    past ``MAX_ROWS`` the unedited rows are sampled and weighted back."""
    positives = sum(labels)
    if positives < MIN_POSITIVES or positives == len(labels):
        return None
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(rows, dtype=float)
    y = np.asarray(labels, dtype=int)
    weights = np.ones(len(y))
    negatives = len(y) - positives
    if len(y) > MAX_ROWS and negatives > 0:
        keep_rate = max(0.01, (MAX_ROWS - positives) / negatives)
        rng = np.random.default_rng(seed)
        keep = (y == 1) | (rng.random(len(y)) < keep_rate)
        x, y = x[keep], y[keep]
        weights = np.where(y == 1, 1.0, 1.0 / keep_rate)
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    model = LogisticRegression(C=1.0, max_iter=1000)
    model.fit((x - mean) / scale, y, sample_weight=weights)
    return TestModel(
        [float(v) for v in mean],
        [float(v) for v in scale],
        [float(v) for v in model.coef_[0]],
        float(model.intercept_[0]),
        positives,
        len(labels),
        coverage,
    )
