"""A ranking of test files learned from the repository's own history.

Hand-set weights for co-change and path words lose to plain history counting on real
repositories. Instead, each test file gets features of its relation to the changed source
files (co-change overall, recent and per source, path and file-name words, whether it
imports a changed module, how recently and often it changes itself), and a logistic
regression learns their weights from the repository's past commits that changed source
and tests together: features computed with the history *before* each commit, label = the
commit edited that test file. It trains only on commits older than the ones it ranks for
(time split); the backtest (``choice.py``) decides whether it ranks at all.

Logistic regression, not a larger model: its score is a sum of per-feature contributions,
so every selection can say what counted and by how much.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from test_selection.ranking.history import History

FEATURE_VERSION = 2  # 2: the fit kept as plain numbers
FEATURES = (
    "co-change with these sources, per source",  # sum over sources of P(test | source)
    "co-change with these sources",  # log of the commits both changed in
    "recent co-change",  # the same, decayed by age
    "share of these sources' commits",  # co-change / commits that changed any of the sources
    "words of the changed paths in its path",
    "words of the changed paths in its file name",
    "imports a changed module",
    "changed recently itself",
    "changes often itself",
    "co-change with these sources' folders",  # per folder, like the first, one level up
    "its folders mirror a changed path",  # share of a source's folders found in its path
)
TRAIN_COMMITS = 300  # of those, the newest commits that changed source and tests together
MIN_POSITIVES = 30  # fewer labelled test files than this: too little to learn from
REFIT_EVERY = 50  # a fit serves the next commits until history has grown this much
DECAY = 0.995  # per commit, for "recent"
UNSURE = (0.1, 0.9)  # learned probabilities the model cannot call either way
_RELATION = (0, 1, 2, 3, 4, 5, 6, 9, 10)  # features that relate a test file to the change
_STOP = {"test", "tests", "init", "py", "src", "__init__", "utils", "util", "common", "main"}
_SPLIT = re.compile(r"[/_.\-]+")


@lru_cache(maxsize=65536)
def _words(path: str) -> frozenset[str]:
    return frozenset(w for w in _SPLIT.split(path.lower()) if len(w) > 1 and w not in _STOP)


@lru_cache(maxsize=65536)
def _test_words(test: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """A test file's path words, file-name words and folders (asked for on every change)."""
    stem = test.rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    return _words(test), _words(stem), frozenset(test.split("/")[:-1])


def _module(path: str) -> str | None:
    if not path.endswith(".py"):
        return None
    module = path[:-3].replace("/", ".")
    return module.removesuffix(".__init__")


@lru_cache(maxsize=65536)
def _prefix_set(imports: frozenset[str]) -> frozenset[str]:
    """Every dotted prefix of every imported name: "a.b.c" gives a, a.b and a.b.c."""
    out: set[str] = set()
    for name in imports:
        parts = name.split(".")
        out.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    return frozenset(out)


_PREFIXES: dict[int, tuple[set[str], frozenset[str]]] = {}


def _prefixes(imports: set[str]) -> frozenset[str]:
    """The prefixes of one test file's imports; the same set object is asked for on every
    change, so its answer is kept by identity (and checked, in case the id was reused)."""
    kept = _PREFIXES.get(id(imports))
    if kept is not None and kept[0] is imports:
        return kept[1]
    answer = _prefix_set(frozenset(imports))
    if len(_PREFIXES) > 65536:
        _PREFIXES.clear()
    _PREFIXES[id(imports)] = (imports, answer)
    return answer


def _add_share(
    history: History, indexes: Sequence[int], test_set: set[str], into: dict[str, float]
) -> None:
    """Add, per test file, the share of the commits ``indexes`` that changed it too."""
    if not indexes:
        return
    counts: Counter[str] = Counter()
    for i in indexes:
        counts.update(test_set.intersection(history.files[i]))
    for test, count in counts.items():
        into[test] += count / len(indexes)


def features(
    history: History,
    at: int,
    sources: Iterable[str],
    test_files: Sequence[str],
    imports: dict[str, set[str]],
) -> list[list[float]]:
    """One row per test file: its relation to ``sources`` with history before index ``at``."""
    sources = set(sources)
    seen: dict[str, Sequence[int]] = {}
    for s in sources:
        postings = history.postings.get(s, ())
        seen[s] = postings[: bisect_left(postings, at)]
    together: Counter[str] = Counter()
    recent: dict[str, float] = defaultdict(float)
    pair: dict[str, float] = defaultdict(float)
    test_set = set(test_files)
    any_source: set[int] = set()
    for indexes in seen.values():
        _add_share(history, indexes, test_set, pair)
        any_source.update(indexes)
    for i in any_source:
        for test in history.files[i]:
            if test in test_set:
                together[test] += 1
                recent[test] += DECAY ** (at - i)
    folder_pair: dict[str, float] = defaultdict(float)
    folders = {s.rsplit("/", 1)[0] for s in sources if "/" in s}
    for folder in folders:
        indexes = sorted(
            {i for p, ix in history.folder_postings.get(folder, {}).items() for i in ix if i < at}
        )
        _add_share(history, indexes, test_set, folder_pair)
    source_dirs = [[d for d in s.split("/")[:-1] if d not in _STOP] for s in sources]
    words = set().union(*(_words(s) for s in sources)) if sources else set()
    modules = [m.split(".") for m in (_module(s) for s in sources) if m]
    rows = []
    for test in test_files:
        postings = history.postings.get(test, ())
        touched = bisect_left(postings, at)
        path_words, stem_words, test_dirs = _test_words(test)
        imported = 0.0
        names = _prefixes(imports.get(test, set()))
        for parts in modules:
            for k in range(len(parts), 0, -1):
                if ".".join(parts[:k]) in names:
                    imported = max(imported, k / len(parts))
                    break
        rows.append(
            [
                pair[test],
                math.log1p(together[test]),
                recent[test],
                together[test] / len(any_source) if any_source else 0.0,
                float(len(words & path_words)),
                float(len(words & stem_words)),
                imported,
                DECAY ** (at - postings[touched - 1]) if touched else 0.0,
                math.log1p(touched),
                folder_pair[test],
                _mirror(source_dirs, test_dirs),
            ]
        )
    return rows


def _mirror(source_dirs: list[list[str]], test_dirs: frozenset[str]) -> float:
    """How much of a changed file's folder path reappears in the test's folder path
    (``pkg/models/llama/x.py`` and ``tests/pkg/models/llama/test_x.py``: 1.0)."""
    best = 0.0
    for dirs in source_dirs:
        if dirs:
            best = max(best, sum(d in test_dirs for d in dirs) / len(dirs))
    return best


@dataclass
class Ranker:
    """A fitted model as plain numbers (no scikit-learn needed to use it), and what it
    learned from."""

    mean: list[float]
    scale: list[float]
    coef: list[float]
    intercept: float
    trained_on: int  # commits
    positives: int
    fitted_at: str  # the revision whose history it learned from

    def contributions(self, row: list[float]) -> list[float]:
        """Each feature's additive share of the score (standardized value x weight)."""
        return [
            (value - mean) / (scale or 1.0) * weight
            for value, mean, scale, weight in zip(
                row, self.mean, self.scale, self.coef, strict=True
            )
        ]

    def scores(self, rows: list[list[float]]) -> list[float]:
        out = []
        for row in rows:
            z = self.intercept + sum(self.contributions(row))
            out.append(1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z)))))
        return out


def is_source(path: str, is_test: Any) -> bool:
    """Anything but a test: a change to a config, a schema or a workflow moves tests too."""
    return not is_test(path)


def fit(
    history: History,
    test_files: Sequence[str],
    imports: dict[str, set[str]],
    is_test: Any,
    until: int | None = None,
    rows_cache: dict[int, list[list[float]]] | None = None,
) -> tuple[Ranker | None, str]:
    """Learn from the newest commits of ``history`` before index ``until`` (all of it by
    default) that changed sources and test files; (None, why) when there is too little.
    ``rows_cache`` keeps each commit's feature rows for the next fit over the same files."""
    until = len(history.files) if until is None else until
    present = set(test_files)
    examples: list[int] = []
    for index in range(until - 1, -1, -1):
        paths = history.files[index]
        if any(p in present for p in paths) and any(is_source(p, is_test) for p in paths):
            examples.append(index)
            if len(examples) >= TRAIN_COMMITS:
                break
    rows: list[list[float]] = []
    labels: list[int] = []
    for index in reversed(examples):
        paths = history.files[index]
        sources = [p for p in paths if is_source(p, is_test)]
        edited = {p for p in paths if p in present}
        if rows_cache is not None and index in rows_cache:
            rows += rows_cache[index]
        else:
            example = features(history, index, sources, test_files, imports)
            if rows_cache is not None:
                rows_cache[index] = example
            rows += example
        labels += [int(t in edited) for t in test_files]
    positives = sum(labels)
    if positives < MIN_POSITIVES or positives == len(labels):
        return None, (
            f"{len(examples)} commit(s) in the last {until} changed source and "
            f"tests together ({positives} test-file edits; {MIN_POSITIVES} needed to learn): "
            "no learned ranker"
        )
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(
        StandardScaler(), LogisticRegression(class_weight="balanced", max_iter=1000)
    )
    model.fit(np.array(rows), np.array(labels))
    scaler, logistic = model[0], model[-1]
    ranker = Ranker(
        [float(v) for v in scaler.mean_],
        [float(v) for v in scaler.scale_],
        [float(v) for v in logistic.coef_[0]],
        float(logistic.intercept_[0]),
        len(examples),
        positives,
        history.shas[until - 1] if until else "",
    )
    return ranker, (
        f"learned from {len(examples)} past commit(s) that changed source and tests together "
        f"({positives} test-file edits)"
    )


class TooLittleHistory(ValueError):
    """Not enough past commits to learn from."""
