"""A ranking of test files learned from the repository's own history.

Hand-set weights for co-change and path words lose to plain history counting on real
repositories. Instead, each test file gets features of its relation to the changed source
files (co-change overall, recent and per source, path and file-name words, whether it
imports a changed module, how recently and often it changes itself), and a logistic
regression learns their weights from the repository's past commits that changed source
and tests together: features computed with the history *before* each commit, label = the
commit edited that test file. It trains only on commits older than the change selected for
(time split), and is refitted as history grows (a fit is reused for the next commits).

Logistic regression, not a larger model: its score is a sum of per-feature contributions,
so every selection can say what counted and by how much. Too little history (fewer than
``MIN_POSITIVES`` edited test files to learn from) leaves the hand weights in charge.
"""

from __future__ import annotations

import hashlib
import math
import pickle
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from test_selection.git import GitError, Repo

FEATURE_VERSION = 1
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
HISTORY_COMMITS = 3000  # history read before the change
TRAIN_COMMITS = 300  # of those, the newest commits that changed source and tests together
MIN_POSITIVES = 30  # fewer labelled test files than this: too little to learn from
REFIT_EVERY = 50  # a fit serves the next commits until history has grown this much
DECAY = 0.995  # per commit, for "recent"
UNSURE = (0.1, 0.9)  # learned probabilities the model cannot call either way
_RELATION = (0, 1, 2, 3, 4, 5, 6, 9, 10)  # features that relate a test file to the change
_STOP = {"test", "tests", "init", "py", "src", "__init__", "utils", "util", "common", "main"}
_SPLIT = re.compile(r"[/_.\-]+")


def _words(path: str) -> set[str]:
    return {w for w in _SPLIT.split(path.lower()) if len(w) > 1 and w not in _STOP}


def _module(path: str) -> str | None:
    if not path.endswith(".py"):
        return None
    module = path[:-3].replace("/", ".")
    return module.removesuffix(".__init__")


@dataclass(frozen=True)
class History:
    """Non-merge commits before (and including) a revision, oldest first, and where each
    path appears (postings), so features for any set of sources are cheap."""

    shas: tuple[str, ...]
    files: tuple[tuple[str, ...], ...]
    postings: dict[str, list[int]]
    # folder -> path in it -> commit indexes (for folder-level co-change)
    folder_postings: dict[str, dict[str, list[int]]]

    @classmethod
    def read(cls, repo: Repo, rev: str, limit: int = HISTORY_COMMITS) -> History:
        try:
            text = repo.text(
                "log",
                "--no-merges",
                "--name-only",
                "--format=%x01%H",
                f"-n{limit}",
                "--end-of-options",
                rev,
                "--",
            )
        except GitError:
            text = ""
        shas: list[str] = []
        files: list[tuple[str, ...]] = []
        for block in reversed(text.split("\x01")):
            lines = [line for line in block.split("\n") if line]
            if lines:
                shas.append(lines[0])
                files.append(tuple(lines[1:]))
        postings: dict[str, list[int]] = defaultdict(list)
        for index, paths in enumerate(files):
            for path in paths:
                postings[path].append(index)
        folder_postings: dict[str, dict[str, list[int]]] = defaultdict(dict)
        for path, indexes in postings.items():
            if "/" in path:
                folder_postings[path.rsplit("/", 1)[0]][path] = indexes
        return cls(tuple(shas), tuple(files), dict(postings), dict(folder_postings))


@lru_cache(maxsize=65536)
def _prefix_set(imports: frozenset[str]) -> frozenset[str]:
    """Every dotted prefix of every imported name: "a.b.c" gives a, a.b and a.b.c."""
    out: set[str] = set()
    for name in imports:
        parts = name.split(".")
        out.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    return frozenset(out)


def _prefixes(imports: set[str]) -> frozenset[str]:
    return _prefix_set(frozenset(imports))


def _add_share(
    history: History, indexes: Sequence[int], test_set: set[str], into: dict[str, float]
) -> None:
    """Add, per test file, the share of the commits ``indexes`` that changed it too."""
    if not indexes:
        return
    counts: Counter[str] = Counter()
    for i in indexes:
        counts.update(p for p in history.files[i] if p in test_set)
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
    seen: dict[str, list[int]] = {
        s: [i for i in history.postings.get(s, ()) if i < at] for s in sources
    }
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
        touches = [i for i in history.postings.get(test, ()) if i < at]
        stem = test.rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
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
                float(len(words & _words(test))),
                float(len(words & _words(stem))),
                imported,
                DECAY ** (at - touches[-1]) if touches else 0.0,
                math.log1p(len(touches)),
                folder_pair[test],
                _mirror(source_dirs, test),
            ]
        )
    return rows


def _mirror(source_dirs: list[list[str]], test: str) -> float:
    """How much of a changed file's folder path reappears in the test's folder path
    (``pkg/models/llama/x.py`` and ``tests/pkg/models/llama/test_x.py``: 1.0)."""
    test_dirs = set(test.split("/")[:-1])
    best = 0.0
    for dirs in source_dirs:
        if dirs:
            best = max(best, sum(d in test_dirs for d in dirs) / len(dirs))
    return best


@dataclass
class Ranker:
    """A fitted model and what it learned from."""

    model: Any  # sklearn Pipeline(StandardScaler, LogisticRegression)
    trained_on: int  # commits
    positives: int
    fitted_at: str  # the revision whose history it learned from

    def contributions(self, row: list[float]) -> list[float]:
        """Each feature's additive share of the score (standardized value x weight)."""
        scaler, logistic = self.model[0], self.model[-1]
        scaled = [(row[j] - scaler.mean_[j]) / (scaler.scale_[j] or 1.0) for j in range(len(row))]
        return [float(v * w) for v, w in zip(scaled, logistic.coef_[0], strict=True)]

    def scores(self, rows: list[list[float]]) -> list[float]:
        import numpy as np

        if not rows:
            return []
        return [float(p) for p in self.model.predict_proba(np.array(rows))[:, 1]]


def is_source(path: str, is_test: Any) -> bool:
    return path.endswith(".py") and not is_test(path)


def fit(
    history: History,
    test_files: Sequence[str],
    imports: dict[str, set[str]],
    is_test: Any,
) -> tuple[Ranker | None, str]:
    """Learn from the newest commits of ``history`` that changed sources and test files;
    (None, why) when there is too little to learn from."""
    present = set(test_files)
    examples: list[int] = []
    for index in range(len(history.files) - 1, -1, -1):
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
        rows += features(history, index, sources, test_files, imports)
        labels += [int(t in edited) for t in test_files]
    positives = sum(labels)
    if positives < MIN_POSITIVES or positives == len(labels):
        return None, (
            f"{len(examples)} commit(s) in the last {len(history.files)} changed source and "
            f"tests together ({positives} test-file edits; {MIN_POSITIVES} needed to learn): "
            "hand weights rank the tests"
        )
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(
        StandardScaler(), LogisticRegression(class_weight="balanced", max_iter=1000)
    )
    model.fit(np.array(rows), np.array(labels))
    ranker = Ranker(model, len(examples), positives, history.shas[-1] if history.shas else "")
    return ranker, (
        f"learned from {len(examples)} past commit(s) that changed source and tests together "
        f"({positives} test-file edits)"
    )


class RankerCache:
    """Fits on disk beside the inventory cache, keyed by the revision they learned at; a fit
    made at most ``REFIT_EVERY`` commits earlier serves (history changes slowly)."""

    def __init__(self, root: Path, key: str) -> None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        self.folder = root / f"ranker-v{FEATURE_VERSION}" / digest

    def find(self, history: History) -> Ranker | None:
        for sha in reversed(history.shas[-REFIT_EVERY:]):
            path = self.folder / f"{sha}.pickle"
            if path.is_file():
                try:
                    with path.open("rb") as handle:
                        ranker = pickle.load(handle)  # our own file, written below
                except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
                    path.unlink(missing_ok=True)  # corrupt: refit
                    continue
                if isinstance(ranker, Ranker):
                    return ranker
        return None

    def store(self, ranker: Ranker) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{ranker.fitted_at}.pickle"
        tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
        with tmp.open("wb") as handle:
            pickle.dump(ranker, handle)
        tmp.replace(path)


@dataclass(frozen=True)
class FileRanking:
    """The learned score of each test file for one change, and why."""

    scores: dict[str, float]
    reasons: dict[str, str]
    note: str
    # files the model cannot call either way: probability in UNSURE, or no relation to the
    # change at all (no co-change, folder, word or import link): where an agent adds most
    unsure: frozenset[str] = frozenset()

    def is_unsure(self, test_file: str) -> bool:
        return test_file in self.unsure


def rank_files(
    repo: Repo,
    base: str,
    sources: Iterable[str],
    test_files: Sequence[str],
    imports: dict[str, set[str]],
    is_test: Any,
    cache_root: Path,
    cache_key: str,
) -> FileRanking | None:
    """Score ``test_files`` for a change of ``sources`` on top of ``base``; None (and the
    hand weights) when the history is too short to learn from."""
    history = History.read(repo, base)
    cache = RankerCache(cache_root, cache_key)
    ranker = cache.find(history)
    note = ""
    if ranker is None:
        ranker, note = fit(history, test_files, imports, is_test)
        if ranker is None:
            raise TooLittleHistory(note)
        cache.store(ranker)
    else:
        note = (
            f"learned from {ranker.trained_on} past commit(s) that changed source and tests "
            f"together ({ranker.positives} test-file edits; fitted at {ranker.fitted_at[:12]})"
        )
    rows = features(history, len(history.files), sources, test_files, imports)
    probabilities = ranker.scores(rows)
    scores, reasons = {}, {}
    unsure = set()
    for test, row, probability in zip(test_files, rows, probabilities, strict=True):
        if UNSURE[0] <= probability <= UNSURE[1] or not any(row[j] for j in _RELATION):
            unsure.add(test)
        parts = sorted(zip(ranker.contributions(row), FEATURES, strict=True), key=lambda x: -x[0])
        top = ", ".join(f"{name} {value:+.2f}" for value, name in parts[:3] if value > 0)
        scores[test] = probability
        reasons[test] = f"learned score {probability:.2f}" + (f" ({top})" if top else "")
    return FileRanking(scores, reasons, note, frozenset(unsure))


class TooLittleHistory(ValueError):
    """Not enough past commits to learn from: the hand weights stay in charge."""
