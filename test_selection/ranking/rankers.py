"""Candidate rankings of test files for a change, each from the history before it.

No ranking wins on every repository: plain history counting is hard to beat where test files
are many and small and change with their sources, a learned model wins where names and
imports say more than co-change does. The backtest (``choice.py``) replays each
candidate on the repository's own recent commits and the selector uses the winner, so each
candidate here only has to be good somewhere. Every ranker sees history strictly before
index ``at`` (a time split: nothing from the change itself or after it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from test_selection.ranking.history import History
from test_selection.ranking.learned import FEATURES, Ranker, _words, features
from test_selection.test_bodies import telling

COUNTING_WINDOW = 1500  # commits of history the counting ranker looks back over
MAX_COMMIT_FILES = 60  # larger commits (formatting sweeps, moves) say nothing about pairs
PATH_WORD_WEIGHT = 0.25  # a shared path word counts this much next to one co-change


@dataclass(frozen=True)
class FileScores:
    """A ranking's score per test file, and (when asked) why."""

    scores: dict[str, float]
    reasons: dict[str, str]


class FileRanker(Protocol):
    name: str
    description: str

    def rank(
        self,
        history: History,
        at: int,
        sources: set[str],
        test_files: Sequence[str],
        explain: bool = False,
    ) -> FileScores: ...


class HistoryCounting:
    """Co-change counts with the changed files plus shared path words: each past commit
    that changed a source adds (sources it changed / files it changed) to every test file it
    changed too."""

    name = "history"
    description = "history counting + path words"

    def __init__(self, word_weight: float = PATH_WORD_WEIGHT) -> None:
        self.word_weight = word_weight  # 0: co-change counts alone

    def rank(
        self,
        history: History,
        at: int,
        sources: set[str],
        test_files: Sequence[str],
        explain: bool = False,
    ) -> FileScores:
        present = set(test_files)
        start = max(0, at - COUNTING_WINDOW)
        touched_by: dict[int, int] = defaultdict(int)
        for source in sources:
            for index in history.postings.get(source, ()):
                if start <= index < at:
                    touched_by[index] += 1
        together: dict[str, float] = defaultdict(float)
        commits: dict[str, int] = defaultdict(int)
        for index, touched in touched_by.items():
            paths = history.files[index]
            if len(paths) > MAX_COMMIT_FILES:
                continue
            share = touched / len(paths)
            for path in paths:
                if path in present:
                    together[path] += share
                    commits[path] += 1
        words = set().union(*(_words(s) for s in sources)) if sources else set()
        scores: dict[str, float] = {}
        reasons: dict[str, str] = {}
        for test in test_files:
            shared = words & _words(test) if words else set()
            score = together.get(test, 0.0) + self.word_weight * len(shared)
            scores[test] = score
            if explain and score > 0:
                parts = []
                if commits.get(test):
                    parts.append(f"changed with these sources in {commits[test]} past commit(s)")
                if shared:
                    parts.append(f"path words {', '.join(sorted(shared)[:3])}")
                reasons[test] = "; ".join(parts)
        return FileScores(scores, reasons)


class LearnedRanking:
    """The logistic model of ``learned.py``, fitted on commits before the ones it ranks for."""

    name = "learned"
    description = "learned model"

    def __init__(self, ranker: Ranker, imports: dict[str, set[str]]) -> None:
        self.ranker = ranker
        self.imports = imports

    def rank(
        self,
        history: History,
        at: int,
        sources: set[str],
        test_files: Sequence[str],
        explain: bool = False,
    ) -> FileScores:
        rows = features(history, at, sources, test_files, self.imports)
        probabilities = self.ranker.scores(rows)
        scores = dict(zip(test_files, probabilities, strict=True))
        reasons: dict[str, str] = {}
        if explain:
            for test, row, probability in zip(test_files, rows, probabilities, strict=True):
                parts = sorted(
                    zip(self.ranker.contributions(row), FEATURES, strict=True), key=lambda x: -x[0]
                )
                top = ", ".join(f"{name} {value:+.2f}" for value, name in parts[:3] if value > 0)
                reasons[test] = f"learned score {probability:.2f}" + (f" ({top})" if top else "")
        return FileScores(scores, reasons)


def mean_log_rank(
    positions: Sequence[Mapping[str, int]], test_files: Sequence[str]
) -> dict[str, float]:
    """Rankings as one score: the files by the mean log of their ranks, so a file either
    ranking puts near the top stays near it. Positive: a file no ranking has evidence for
    still has a place in the order."""
    return {f: math.exp(-0.5 * sum(math.log1p(p[f]) for p in positions)) for f in test_files}


def rank_positions(scores: dict[str, float], test_files: Sequence[str]) -> dict[str, int]:
    """0-based rank of each file, best first; ties broken by path so rankings are stable."""
    order = sorted(test_files, key=lambda f: (-scores.get(f, 0.0), f))
    return {f: r for r, f in enumerate(order)}


class WordsRanking:
    """Test files by how much their tests use the change's words (rare ones across the
    whole suite count more): a file's score is its best test's. History cannot place a new
    test file, or one that never changed with these sources; what its tests call can."""

    name = "words"
    description = "the change's words in the tests"

    def __init__(self, words: frozenset[str], tokens: Mapping[str, Sequence[frozenset[str]]]):
        self.words = words
        self.tokens = tokens  # test file -> its tests' tokens, as they were before the change

    def rank(
        self,
        history: History,
        at: int,
        sources: set[str],
        test_files: Sequence[str],
        explain: bool = False,
    ) -> FileScores:
        words = self.words
        shared: dict[str, list[frozenset[str]]] = {}
        frequency: dict[str, int] = defaultdict(int)
        total = 0
        for test in test_files:
            found = [toks & words for toks in self.tokens.get(test, ())]
            total += len(found)
            shared[test] = found
            for hit in found:
                for word in hit:
                    frequency[word] += 1
        weight = {w: math.log((total + 1) / (c + 0.5)) for w, c in frequency.items()}
        scores: dict[str, float] = {}
        reasons: dict[str, str] = {}
        for test in test_files:
            best: frozenset[str] = frozenset()
            score = 0.0
            for hit in shared[test]:
                value = sum(weight[w] for w in hit)
                if value > score:
                    score, best = value, hit
            scores[test] = score
            if explain and score > 0:
                rare = sorted(telling(best), key=lambda w: -weight[w])[:4]
                if rare:
                    reasons[test] = f"a test of it uses {', '.join(rare)}"
        return FileScores(scores, reasons)


class Blend:
    """Two rankings at once: files ordered by the mean log of their two ranks, so a file
    either ranking puts near the top stays near it."""

    def __init__(self, first: FileRanker, second: FileRanker, name: str = "blend") -> None:
        self.parts = (first, second)
        self.name = name
        self.description = f"{first.description} and {second.description}, blended"

    def rank(
        self,
        history: History,
        at: int,
        sources: set[str],
        test_files: Sequence[str],
        explain: bool = False,
    ) -> FileScores:
        ranked = [p.rank(history, at, sources, test_files, explain) for p in self.parts]
        positions = [rank_positions(r.scores, test_files) for r in ranked]
        scores = mean_log_rank(positions, test_files)
        reasons: dict[str, str] = {}
        if explain:
            for f in test_files:
                reasons[f] = "; ".join(
                    f"{part.description} #{pos[f] + 1}"
                    + (f" ({r.reasons[f]})" if r.reasons.get(f) else "")
                    for part, pos, r in zip(self.parts, positions, ranked, strict=True)
                )
        return FileScores(scores, reasons)


class CoverageBoost:
    """A ranking with the files a coverage map reaches moved up: each file is placed by the
    mean log of its rank under the ranking and under the map (files by their most specific
    test that executed a changed function; files the map does not reach share the last
    place, so among themselves they keep the ranking's order)."""

    def __init__(self, base: FileRanker, reach: Mapping[str, float]) -> None:
        self.base = base
        self.reach = reach  # test file -> its best specificity
        self.name = base.name
        self.description = f"{base.description}, files the coverage map reaches first"

    def rank(
        self,
        history: History,
        at: int,
        sources: set[str],
        test_files: Sequence[str],
        explain: bool = False,
    ) -> FileScores:
        ranked = self.base.rank(history, at, sources, test_files, explain)
        return boost(ranked, self.reach, test_files, explain)


def boost(
    ranked: FileScores,
    reach: Mapping[str, float],
    test_files: Sequence[str],
    explain: bool = False,
) -> FileScores:
    """``ranked`` with the files of ``reach`` moved up (see ``CoverageBoost``)."""
    if not reach:
        return ranked
    base = rank_positions(ranked.scores, test_files)
    by_map = sorted((f for f in test_files if f in reach), key=lambda f: (-reach[f], f))
    place = {f: k for k, f in enumerate(by_map)}
    last = len(by_map)
    scores = mean_log_rank([base, {f: place.get(f, last) for f in test_files}], test_files)
    reasons = dict(ranked.reasons)
    if explain:
        for f in by_map:
            said = reasons.get(f)
            reasons[f] = (said + "; " if said else "") + (
                f"#{place[f] + 1} of {last} file(s) whose tests executed a changed function"
            )
    return FileScores(scores, reasons)
