"""Choosing how to rank, per repository, by replaying its own recent commits.

No ranking of test files wins everywhere (see ``rankers.py``), so the selector does not
guess: before it selects for a change it takes the repository's most recent commits that
changed source and existing tests together (all of them before the change: a time split),
hides their test edits, and replays every candidate ranking on them with the plan's own
budget rule (``allocation.py``). The one that found the most edited test files and edited
tests wins, and what it measured becomes the numbers the plan spends the budget with.

The work is done at an *anchor*: the change's base rounded down to a multiple of
``REFIT_EVERY`` commits of its history, so neighbouring changes share one backtest (and
one fit of the learned model) from the cache, and history grows into a refit by itself.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from test_selection.allocation import (
    FILE_WEIGHT,
    NO_EVIDENCE,
    Calibration,
    file_values,
    idf_order,
    rank_bucket,
    size_bucket,
)
from test_selection.coverage_map import CoverageIndex, Reach
from test_selection.coverage_select import PastReach, past_reach, reached_first
from test_selection.git import GitError, Repo
from test_selection.history import History
from test_selection.learned import Ranker, fit
from test_selection.model_replay import ModelReplay, ReplayCase, files_to_read, replay_model
from test_selection.rankers import (
    Blend,
    CoverageBoost,
    FileRanker,
    FileScores,
    HistoryCounting,
    LearnedRanking,
    WordsRanking,
    boost,
)
from test_selection.test_bodies import diff_words, split_tests
from test_selection.test_model import ChangeTerms, TestModel, TestText, change_terms

log = logging.getLogger("test_selection.backtest")

FORMAT = 2  # 2: the test model
BACKTEST_CASES = 60  # the most recent commits replayed
MIN_CASES = 12  # fewer: too little history to choose, the prior ranking is used
REFIT_EVERY = 50  # commits of history an anchor serves
MAX_CASE_FILES = 60  # a larger commit is a sweep, not a change and its tests
TIE = 0.005  # a candidate must beat the earlier (simpler) ones by this much
SPREAD, WHOLE = "spread", "whole"  # allocation.py's rule, or whole files in rank order
MODEL = "model"  # each test's chance from the test model (test_model.py)
# with a coverage map: the tests that executed a changed function first in their file, and
# also the files holding them moved up the ranking
REACHED_FIRST, REACHED_FILES = "reached-first", "reached-files"
COVERAGE_LABELS = {
    "": "",
    REACHED_FIRST: ", tests the coverage map reaches first",
    REACHED_FILES: ", files and tests the coverage map reaches first",
}
MODEL_COVERAGE_LABELS = {
    "": "",
    REACHED_FIRST: " reading the coverage map",
    REACHED_FILES: " reading the coverage map, files it reaches first",
}
# the winner may not find fewer edited test files, or fewer edited tests, than history
# counting taking whole files (the plain baseline) did on the same commits, by more than
TOLERANCE = 0.02
AGENT_CASES = 12  # newest commits (that edited existing tests) an agent is measured on
AGENT_TEXTS = 800  # tests of those commits' files it reads in all
AGENT_NEW_TEXTS = 200  # of which one selection reads at most this many new ones: the
# measurement spreads over a few selections instead of making one of them slow
AGENT_MARGIN = 0.05  # how much earlier (share of a file) it must place the edited tests
MIN_AGENT_TESTS = 25


@dataclass(frozen=True)
class Case:
    """One past commit, replayed: what it changed and what it did to the tests."""

    index: int  # in the History
    sha: str
    sources: frozenset[str]
    # test file -> (its tests before the commit, positions of the edited ones in the
    # within-file order the change's words give)
    truth: dict[str, tuple[int, tuple[int, ...]]]
    words: frozenset[str] = frozenset()  # of its source change
    # the tests of its test files as they were before it (the words ranking reads them)
    before: dict[str, tuple[frozenset[str], ...]] = field(default_factory=dict)
    # test file -> its tests' names (``Class::name``) in the within-file order of ``truth``
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # what the test model reads (``test_model.py``): the change's terms, and per test file
    # its tests in file order and the indexes of the edited ones
    terms: ChangeTerms | None = None
    texts: dict[str, tuple[TestText, ...]] = field(default_factory=dict)
    edited_at: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Figures:
    """What one candidate ranking found on the backtest."""

    name: str
    description: str
    file_recall: float
    test_recall: float
    allocation: str = SPREAD
    coverage: str = ""  # "", REACHED_FIRST or REACHED_FILES: how the coverage map is used

    @property
    def objective(self) -> float:
        return self.file_recall + self.test_recall

    @property
    def label(self) -> str:
        if self.allocation == MODEL:
            return (
                self.description
                + ", tests by the test model"
                + MODEL_COVERAGE_LABELS[self.coverage]
            )
        return (
            self.description
            + (", whole files" if self.allocation == WHOLE else "")
            + COVERAGE_LABELS[self.coverage]
        )

    @property
    def key(self) -> str:
        return f"{self.name}/{self.allocation}/{self.coverage}"

    def to_json(self) -> dict[str, Any]:
        return {
            "ranking": self.name,
            "allocation": self.allocation,
            "coverage": self.coverage,
            "description": self.label,
            "file_recall": round(self.file_recall, 4),
            "edited_test_recall": round(self.test_recall, 4),
        }


Similarity = Callable[[list[str], list[str]], list[float]]  # (hunks, texts) -> per text


class Reader(Protocol):
    """An agent that reads a change and tests (``agents.LocalAgent``)."""

    name: str

    def similarities(self, hunks: list[str], texts: list[str]) -> list[float]: ...

    def embed_ahead(self, texts: list[str], budget: int) -> int:
        """Read up to ``budget`` of the texts it has not read yet; how many are left."""
        ...


@dataclass(frozen=True)
class AgentVerdict:
    """Whether an agent's reading of the change put the edited tests of past commits
    earlier in their files than the change's words did: it runs only if so."""

    agent: str
    runs: bool
    words: float  # mean place of the edited tests in their file (0 first, 1 last), words
    with_agent: float  # the same with the agent's similarity blended into the order
    measured: int  # edited tests measured
    commits: int
    seconds: float
    pending: int = 0  # tests still to read before it can be judged
    # not measured in a selection that replayed the ranking's backtest (the two together
    # took a first selection on a large history past 20 s): the next selection measures it
    deferred: bool = False

    def note(self) -> str:
        if self.deferred:
            return (
                f"the {self.agent} agent was skipped: it is measured from the next selection "
                "on (this one replayed the ranking's backtest)"
            )
        if self.pending:
            return (
                f"the {self.agent} agent was skipped while it is measured: {self.pending} "
                f"test(s) of past commits still to read (at most {AGENT_NEW_TEXTS} a selection)"
            )
        figures = (
            f"on {self.commits} past commit(s) ({self.measured} edited tests) it placed them at "
            f"{self.with_agent:.0%} of their file on average, against {self.words:.0%} for the "
            f"change's words alone ({self.seconds:.1f} s to measure)"
        )
        if self.runs:
            return f"the {self.agent} agent orders tests within files: {figures}"
        if self.measured < MIN_AGENT_TESTS:
            return (
                f"the {self.agent} agent was skipped: too little to measure it on "
                f"({self.measured} edited tests; {MIN_AGENT_TESTS} needed)"
            )
        return (
            f"the {self.agent} agent was skipped: {figures}; it must be "
            f"{AGENT_MARGIN:.0%} better to earn its time"
        )


@dataclass
class RankingChoice:
    """The ranking a plan uses, why, and the numbers it spends the budget with."""

    chosen: str
    description: str
    calibration: Calibration
    learned: Ranker | None = None  # fitted up to the anchor, when a candidate needs it
    figures: list[Figures] = field(default_factory=list)
    cases: int = 0
    anchor: str = ""
    fraction: float = 0.15
    reason: str = ""
    seconds: float = 0.0
    agent: AgentVerdict | None = None  # set by the selector (measured apart, cached apart)
    allocation: str = SPREAD
    coverage: str = ""  # how the coverage map is used ("": not at all)
    test_model: TestModel | None = None  # with allocation MODEL: fitted up to the anchor

    def ranker(
        self,
        imports: dict[str, set[str]],
        words: frozenset[str],
        tokens: Mapping[str, Sequence[frozenset[str]]],
        reach: Mapping[str, float] | None = None,
    ) -> FileRanker:
        """The chosen ranking, for a change with these words over tests with these tokens
        (and, where the choice moves them up, the files a coverage map reaches)."""
        made = candidates(self.learned, imports, words, tokens)
        chosen = made.get(self.chosen) or made["history"]
        if self.coverage == REACHED_FILES and reach:
            return CoverageBoost(chosen, reach)
        return chosen

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "allocation": self.allocation,
            "coverage": self.coverage,
            "description": self.description,
            "reason": self.reason,
            "backtest_commits": self.cases,
            "anchor": self.anchor,
            "budget_fraction": round(self.fraction, 4),
            "candidates": [f.to_json() for f in self.figures],
            "agent": self.agent.note() if self.agent else None,
        }


CANDIDATES = ("history", "learned", "blend", "history+words", "learned+words")


def candidates(
    fitted: Ranker | None,
    imports: dict[str, set[str]],
    words: frozenset[str],
    tokens: Mapping[str, Sequence[frozenset[str]]],
) -> dict[str, FileRanker]:
    """Every candidate ranking (those needing the learned model only with a fit), by name,
    in the order a tie goes to."""
    counting = HistoryCounting()
    read = WordsRanking(words, tokens)
    learned = LearnedRanking(fitted, imports) if fitted is not None else None
    out: dict[str, FileRanker] = {"history": counting}
    if learned is not None:
        out["learned"] = learned
        out["blend"] = Blend(counting, learned)
    out["history+words"] = Blend(counting, read, "history+words")
    if learned is not None:
        out["learned+words"] = Blend(learned, read, "learned+words")
    return out


def _eligible(
    history: History,
    last: int,
    universe: set[str],
    is_test: Callable[[str], bool],
    limit: int = BACKTEST_CASES,
) -> list[int]:
    """The newest ``BACKTEST_CASES`` commits up to index ``last`` that modified a test file of
    the universe and changed a source file, in a commit small enough to be one change."""
    found: list[int] = []
    for index in range(last, -1, -1):
        paths = history.files[index]
        if len(paths) > MAX_CASE_FILES:
            continue
        modified = history.modified[index] if index < len(history.modified) else {}
        if not any(p in universe for p in modified) or all(is_test(p) for p in paths):
            continue
        found.append(index)
        if len(found) >= limit:
            break
    return found


@dataclass(frozen=True)
class CaseDiff:
    """One case's source change as read from ``git show -U0``."""

    lines: list[str]  # hunk headers and changed lines, in the diff's order
    hunks: list[str]  # per file, ``path`` then its changed lines (what an agent reads)
    contexts: list[str]
    removed: list[str]
    added: list[str]


def _case_words(
    repo: Repo, history: History, indexes: list[int], sources: set[str]
) -> dict[str, tuple[frozenset[str], ChangeTerms]]:
    """The words of each case's source change, and its terms for the test model."""
    diffs = _case_diffs(repo, history, indexes, sources)
    out = {}
    for sha, diff in diffs.items():
        words = diff_words(diff.lines)
        out[sha] = (words, change_terms(words, diff.contexts, diff.removed, diff.added))
    return out


def _case_diffs(
    repo: Repo, history: History, indexes: list[int], sources: set[str]
) -> dict[str, CaseDiff]:
    """Per case: its changed and hunk-context lines, and its hunks as an agent reads them
    (``path`` then the lines), from one ``git show`` over all of them."""
    if not indexes or not sources:
        return {}
    shas = [history.shas[i] for i in indexes]
    try:
        text = repo.text(
            "show",
            "-U0",
            "--no-color",
            "--no-renames",
            "--format=%x01%H",
            *shas,
            "--",
            *sorted(sources),
        )
    except GitError as exc:
        log.warning("backtest: reading the cases' diffs failed: %s", exc)
        return {}
    out: dict[str, CaseDiff] = {}
    for block in text.split("\x01"):
        if not block.strip():
            continue
        sha, _, body = block.partition("\n")
        lines: list[str] = []
        hunks: dict[str, list[str]] = {}
        contexts: list[str] = []
        removed: list[str] = []
        added: list[str] = []
        path = ""
        for line in body.split("\n"):
            if line.startswith("+++ b/") or line.startswith("--- a/"):
                path = line[6:]
            elif line.startswith("@@"):
                lines.append(line.split("@@")[-1])
                contexts.append(lines[-1])
            elif line[:1] in "+-" and not line.startswith(("+++", "---")):
                lines.append(line[1:])
                (added if line[:1] == "+" else removed).append(line[1:])
                hunks.setdefault(path, []).append(line[1:])
        texts = [f"{p}\n" + "\n".join(h)[:2000] for p, h in hunks.items()][:20]
        out[sha.strip()] = CaseDiff(lines, texts, contexts, removed, added)
    return out


def build_cases(
    repo: Repo,
    history: History,
    last: int,
    universe: set[str],
    is_test: Callable[[str], bool],
    limit: int = BACKTEST_CASES,
) -> list[Case]:
    """The backtest's commits, newest first, with their truth read from both versions of
    every test file they modified."""
    indexes = _eligible(history, last, universe, is_test, limit)
    sources: set[str] = set()
    blobs: set[str] = set()
    for index in indexes:
        sources |= {p for p in history.files[index] if not is_test(p)}
        for path, pair in history.modified[index].items():
            if path in universe:
                blobs.update(pair)
    words = _case_words(repo, history, indexes, sources)
    try:
        contents = repo.read_blobs(sorted(blobs))
    except GitError as exc:
        log.warning("backtest: reading the cases' test files failed: %s", exc)
        return []
    cases = []
    for index in indexes:
        sha = history.shas[index]
        change_words, terms = words.get(sha, (frozenset(), change_terms(frozenset(), [], [], [])))
        truth: dict[str, tuple[int, tuple[int, ...]]] = {}
        before_tokens: dict[str, tuple[frozenset[str], ...]] = {}
        in_order: dict[str, tuple[str, ...]] = {}
        texts: dict[str, tuple[TestText, ...]] = {}
        edited_at: dict[str, tuple[int, ...]] = {}
        for path, (old, new) in history.modified[index].items():
            if path not in universe or old not in contents or new not in contents:
                continue
            before = split_tests(contents[old].decode("utf-8", "replace"))
            after = split_tests(contents[new].decode("utf-8", "replace"))
            names = list(before)
            order, _scores = idf_order(
                [(before[n].tokens, before[n].lines) for n in names], change_words
            )
            position = {names[i]: k for k, i in enumerate(order)}
            edited = sorted(
                position[n]
                for n, body in before.items()
                if n in after and after[n].digest != body.digest
            )
            truth[path] = (len(names), tuple(edited))
            before_tokens[path] = tuple(before[n].tokens for n in names)
            in_order[path] = tuple(names[i] for i in order)
            texts[path] = tuple(TestText(n, before[n].tokens, before[n].lines) for n in names)
            edited_at[path] = tuple(
                i for i, n in enumerate(names) if n in after and after[n].digest != before[n].digest
            )
        if truth:
            sources_here = frozenset(p for p in history.files[index] if not is_test(p))
            cases.append(
                Case(
                    index,
                    sha,
                    sources_here,
                    truth,
                    change_words,
                    before_tokens,
                    in_order,
                    terms,
                    texts,
                    edited_at,
                )
            )
    return cases


def measure_agent(
    repo: Repo,
    history: History,
    last: int,
    universe: set[str],
    is_test: Callable[[str], bool],
    reader: Reader,
) -> AgentVerdict:
    """Replay the agent on the newest commits up to ``last`` that edited existing tests:
    does blending its similarity into each file's word order put the edited tests earlier?
    Reads at most ``AGENT_NEW_TEXTS`` new tests per call; until all are read, the verdict is
    pending (and the agent does not run)."""
    started = time.perf_counter()
    cases = build_cases(repo, history, last, universe, is_test, limit=AGENT_CASES * 3)
    sample = [c for c in cases if any(edited for _n, edited in c.truth.values())][:AGENT_CASES]
    sources = {p for c in sample for p in c.sources}
    diffs = _case_diffs(repo, history, [c.index for c in sample], sources)
    blobs = {
        b
        for c in sample
        for p, pair in history.modified[c.index].items()
        if p in c.truth
        for b in pair
    }
    contents = repo.read_blobs(sorted(blobs)) if blobs else {}
    files: list[
        tuple[list[str], list[str], list[int], list[int]]
    ] = []  # hunks, texts, order, edited
    read = 0
    commits = set()
    for case in sample:
        diff = diffs.get(case.sha)
        lines, hunks = (diff.lines, diff.hunks) if diff else ([], [])
        words = diff_words(lines)
        for path in case.truth:
            old, new = history.modified[case.index][path]
            if old not in contents or new not in contents:
                continue
            before = split_tests(contents[old].decode("utf-8", "replace"))
            after = split_tests(contents[new].decode("utf-8", "replace"))
            names = list(before)
            edited = [
                i for i, n in enumerate(names) if n in after and after[n].digest != before[n].digest
            ]
            if not edited or len(names) < 2 or read + len(names) > AGENT_TEXTS:
                continue
            read += len(names)
            order, _scores = idf_order([(before[n].tokens, before[n].lines) for n in names], words)
            files.append((hunks, [before[n].head for n in names], order, edited))
            commits.add(case.sha)
    pending = reader.embed_ahead([t for _h, texts, _o, _e in files for t in texts], AGENT_NEW_TEXTS)
    words_places: list[float] = []
    agent_places: list[float] = []
    if not pending:
        for hunks, texts, order, edited in files:
            blended = blend_orders(order, reader.similarities(hunks, texts))
            word_place = {i: k for k, i in enumerate(order)}
            agent_place = {i: k for k, i in enumerate(blended)}
            for i in edited:
                words_places.append(word_place[i] / len(texts))
                agent_places.append(agent_place[i] / len(texts))
    measured = len(words_places)
    words_mean = sum(words_places) / measured if measured else 0.0
    agent_mean = sum(agent_places) / measured if measured else 0.0
    return AgentVerdict(
        reader.name,
        measured >= MIN_AGENT_TESTS and agent_mean <= words_mean - AGENT_MARGIN,
        words_mean,
        agent_mean,
        measured,
        len(commits),
        time.perf_counter() - started,
        pending,
    )


def blend_orders(order: list[int], similarity: Sequence[float]) -> list[int]:
    """A file's word order and an agent's similarity, as one order (their ranks summed)."""
    by_agent = sorted(range(len(similarity)), key=lambda i: (-similarity[i], i))
    agent_rank = {i: k for k, i in enumerate(by_agent)}
    word_rank = {i: k for k, i in enumerate(order)}
    return sorted(order, key=lambda i: (word_rank[i] + agent_rank[i], word_rank[i]))


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


def with_reach(case: Case, reach: Mapping[str, Mapping[str, Reach]]) -> tuple[Case, dict[str, int]]:
    """The case with each file's tests that the map says executed the change first (the
    order the selector uses with a map), and how many lead each of its files."""
    truth: dict[str, tuple[int, tuple[int, ...]]] = {}
    counts = {path: len(tests) for path, tests in reach.items()}
    for path, (tests, edited) in case.truth.items():
        names = case.names.get(path, ())
        found = reach.get(path, {})
        reaches = [found.get(n) for n in names]
        # the file as it was: a test the map knows but the file did not have yet is not there
        counts[path] = sum(1 for r in reaches if r is not None)
        if not counts[path] or len(names) != tests:
            truth[path] = (tests, edited)
            continue
        order = reached_first(range(tests), reaches)
        position = {i: k for k, i in enumerate(order)}
        truth[path] = (tests, tuple(sorted(position[p] for p in edited)))
    return replace(case, truth=truth), counts


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


def _evaluate(
    ranked: list[tuple[list[str], dict[str, int]]],
    cases: Sequence[Case],
    sizes: Mapping[str, int],
    shared: Calibration,
    fraction: float,
    file_weight: float,
    allocation: str = SPREAD,
    reached: Sequence[Mapping[str, int]] | None = None,
    replay: ModelReplay | None = None,
) -> tuple[float, float, Calibration]:
    """File and edited-test recall of one ranking over the cases, each case planned with
    the rank chances measured on the *other* cases (no case grades itself). ``reached``:
    per case, the tests of each file a coverage map puts first (``with_reach``);
    ``replay``: with allocation MODEL, the test model's chances per case."""
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
        if allocation == WHOLE:
            counts = whole_counts(order, case_sizes, fraction * total)
        elif allocation == MODEL and replay is not None:
            counts = model_counts(
                file_buckets, case_sizes, loo, fraction * total, file_weight, replay, k
            )
            positions.update(replay.edited[k])
        else:
            counts = allocate_counts(
                file_buckets,
                case_sizes,
                loo,
                fraction * total,
                file_weight,
                reached[k] if reached is not None else None,
            )
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


def choose(
    repo: Repo,
    history: History,
    anchor: int,
    sizes: Mapping[str, int],
    imports: dict[str, set[str]],
    is_test: Callable[[str], bool],
    fraction: float,
    file_weight: float = FILE_WEIGHT,
    only: str | None = None,
    tokens: Mapping[str, Sequence[frozenset[str]]] | None = None,
    coverage: CoverageIndex | None = None,
    texts: Mapping[str, Sequence[TestText]] | None = None,
) -> RankingChoice:
    """Replay the candidates on the commits up to ``anchor`` and return the winner (or the
    one named by ``only``), with its measured calibration. ``tokens``: each test file's
    tests' tokens now (the replayed commits' own test files are read as they were).
    With ``coverage``, every candidate is replayed again with the tests the map says each
    commit's change executed first in their files (and once more with their files moved
    up); such a variant wins only if it finds no fewer edited files and tests than the
    winner without the map, and more of both together. ``texts``: each test file's tests
    now, for the test model (``test_model.py``): without them it is not replayed."""
    tokens = tokens or {}
    started = time.perf_counter()
    files = sorted(sizes)
    universe = set(files)
    cases = build_cases(repo, history, anchor, universe, is_test)
    anchor_sha = history.shas[anchor] if 0 <= anchor < len(history.shas) else ""
    counting = HistoryCounting()
    if len(cases) < MIN_CASES:
        return RankingChoice(
            counting.name,
            counting.description,
            Calibration.prior(),
            cases=len(cases),
            anchor=anchor_sha,
            fraction=fraction,
            reason=(
                f"too little history to choose a ranking: {len(cases)} commit(s) in the last "
                f"{anchor + 1} changed source and existing tests together ({MIN_CASES} needed); "
                f"{counting.description} ranks with prior numbers"
            ),
            seconds=time.perf_counter() - started,
        )
    shared = shared_calibration(cases)
    start = min(c.index for c in cases)
    rows: dict[int, list[list[float]]] = {}  # shared by both fits
    backtest_fit, why = fit(history, files, imports, is_test, until=start, rows_cache=rows)
    notes = []
    if backtest_fit is None and only in ("learned", "blend", "learned+words"):
        # asked for by name: learn from the replayed commits too (its figures flatter it)
        backtest_fit, why = fit(history, files, imports, is_test, until=anchor + 1, rows_cache=rows)
        if backtest_fit is not None:
            notes.append("the learned model was fitted on the replayed commits themselves")
    if backtest_fit is None:
        notes.append(f"the learned model could not be fitted before the backtest ({why})")
    names = list(candidates(backtest_fit, imports, frozenset(), {}))
    if only is not None:
        names = [n for n in names if n == only] or ["history"]
    figures: list[Figures] = []
    calibrations: dict[str, Calibration] = {}
    replayed: dict[str, list[tuple[list[str], dict[str, int]]]] = {name: [] for name in names}
    boosted: dict[str, list[tuple[list[str], dict[str, int]]]] = {name: [] for name in names}
    python = {p for c in cases for p in c.sources if p.endswith(".py")}
    reach: PastReach = (
        past_reach(
            coverage,
            repo,
            [
                (c.sha, {p: b for p, b in history.modified[c.index].items() if p in python})
                for c in cases
            ],
        )
        if coverage
        else {}
    )
    descriptions: dict[str, str] = {}
    for case in cases:
        # each case's words, over the tests as they were before it
        before = {**tokens, **case.before}
        made = candidates(backtest_fit, imports, case.words, before)
        best_reach = {
            f: max(r.specificity for r in tests.values())
            for f, tests in reach.get(case.sha, {}).items()
        }
        for name in names:
            scores = made[name].rank(history, case.index, set(case.sources), files)
            order = ranked(scores, files)
            replayed[name].append((order, buckets(scores, order)))
            descriptions[name] = made[name].description
            if coverage is not None:
                moved = boost(scores, best_reach, files)
                order = ranked(moved, files)
                boosted[name].append((order, buckets(moved, order)))
    for allocation in (WHOLE, SPREAD):
        for name in names:
            file_recall, test_recall, calibration = _evaluate(
                replayed[name], cases, sizes, shared, fraction, file_weight, allocation
            )
            figures.append(Figures(name, descriptions[name], file_recall, test_recall, allocation))
            calibrations[figures[-1].key] = calibration
    models: dict[str, TestModel] = {}  # by coverage use
    read: list[set[str]] = []  # per case, the files the test model's replay reads
    if texts is not None:
        total = sum(sizes.values())
        read = [
            files_to_read(
                [replays[name][k][0] for name in names for replays in (replayed, boosted)
                 if replays[name]],
                sizes,
                fraction * total,
            )
            for k in range(len(cases))
        ]  # fmt: skip
        plain = replay_model([_replay_case(c, None) for c in cases], texts, read, False)
        if plain is not None and plain.model is not None:
            models[""] = plain.model
            for name in names:
                file_recall, test_recall, calibration = _evaluate(
                    replayed[name], cases, sizes, shared, fraction, file_weight, MODEL,
                    replay=plain,
                )  # fmt: skip
                fig = Figures(name, descriptions[name], file_recall, test_recall, MODEL)
                figures.append(fig)
                calibrations[fig.key] = calibration
    with_map: list[Figures] = []
    if coverage is not None:
        pairs = [with_reach(case, reach.get(case.sha, {})) for case in cases]
        reached_cases = [case for case, _counts in pairs]
        counts = [counts for _case, counts in pairs]
        reached_shared = shared_calibration(reached_cases, counts)
        for use, replays in ((REACHED_FIRST, replayed), (REACHED_FILES, boosted)):
            for allocation in (WHOLE, SPREAD):
                for name in names:
                    file_recall, test_recall, calibration = _evaluate(
                        replays[name],
                        reached_cases,
                        sizes,
                        reached_shared,
                        fraction,
                        file_weight,
                        allocation,
                        counts,
                    )
                    fig = Figures(
                        name, descriptions[name], file_recall, test_recall, allocation, use
                    )
                    with_map.append(fig)
                    calibrations[fig.key] = calibration
        mapped = (
            replay_model([_replay_case(c, reach.get(c.sha, {})) for c in cases], texts, read, True)
            if texts is not None
            else None
        )
        if mapped is not None and mapped.model is not None:
            models[REACHED_FIRST] = models[REACHED_FILES] = mapped.model
            for use, replays in ((REACHED_FIRST, replayed), (REACHED_FILES, boosted)):
                for name in names:
                    file_recall, test_recall, calibration = _evaluate(
                        replays[name], cases, sizes, shared, fraction, file_weight, MODEL,
                        replay=mapped,
                    )  # fmt: skip
                    fig = Figures(name, descriptions[name], file_recall, test_recall, MODEL, use)
                    with_map.append(fig)
                    calibrations[fig.key] = calibration
    # the plain baseline (history counting, whole files) comes first: ties go to it, and
    # nothing that falls short of it on either figure is taken
    reference = figures[0]
    best = reference
    for fig in figures[1:]:
        if (
            fig.file_recall >= reference.file_recall - TOLERANCE
            and fig.test_recall >= reference.test_recall - TOLERANCE
            and fig.objective > best.objective + TIE
        ):
            best = fig
    without_map = best
    for fig in with_map:
        if (
            fig.file_recall >= without_map.file_recall
            and fig.test_recall >= without_map.test_recall
            and fig.objective > best.objective + TIE
        ):
            best = fig
    live = None
    if "learned" in best.name:
        live, _why = fit(history, files, imports, is_test, until=anchor + 1, rows_cache=rows)
        if live is None:  # cannot happen when the earlier fit worked; stay safe
            best = figures[0]
    reason = (
        f"chosen by backtest on {len(cases)} past commit(s) up to {anchor_sha[:12]} at "
        f"{fraction:.0%} of the tests: "
        + "; ".join(
            f"{f.label} found {f.file_recall:.0%} of edited test files, "
            f"{f.test_recall:.0%} of edited tests"
            for f in figures
        )
    )
    if with_map and coverage is not None:
        top = max(with_map, key=lambda f: f.objective)
        known = sum(1 for case in cases if reach.get(case.sha))
        reason += (
            f"; with the coverage map of {coverage.map.revision[:12]} ({known} of "
            f"{len(cases)} commit(s) changed a function it knows), at best {top.label} found "
            f"{top.file_recall:.0%} of edited test files, {top.test_recall:.0%} of edited tests"
        )
        figures += with_map
    return RankingChoice(
        best.name,
        best.label,
        calibrations[best.key],
        live,
        figures,
        len(cases),
        anchor_sha,
        fraction,
        "; ".join([reason, *notes]),
        time.perf_counter() - started,
        allocation=best.allocation,
        coverage=best.coverage,
        test_model=models.get(best.coverage) if best.allocation == MODEL else None,
    )


def _replay_case(case: Case, reach: Mapping[str, Mapping[str, Reach]] | None) -> ReplayCase:
    return ReplayCase(
        case.terms or change_terms(case.words, [], [], []),
        case.texts,
        case.edited_at,
        reach,
    )


def anchor_index(repo: Repo, history: History, base: str, every: int | None = None) -> int:
    """The index in ``history`` of the base's anchor (see the module docstring): its
    position rounded down to a multiple of ``every`` commits (``REFIT_EVERY``)."""
    every = every or REFIT_EVERY
    if not history.shas:
        return -1
    if history.truncated:
        try:
            total = int(
                repo.text("rev-list", "--count", "--no-merges", "--end-of-options", base).strip()
            )
        except (GitError, ValueError):
            total = len(history.shas)
    else:
        total = len(history.shas)
    return max(-1, len(history.shas) - 1 - (total - 1) % every)


AGENT_REMEASURE = 250  # the agent is measured at anchors this far apart (it is the slow part)


class ChoiceCache:
    """Backtest results on disk, per repository, anchor, budget and setting; and the agent's
    verdict, per repository (it is the slow part, and changes slowly)."""

    def __init__(self, root: Path, key: str) -> None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        self.folder = root / f"backtest-v{FORMAT}" / digest

    def _path(self, anchor: str, fraction: float, file_weight: float) -> Path:
        return self.folder / f"{anchor}-{fraction:.4f}-{file_weight:.3f}.pickle"

    def _read(self, path: Path, kind: type) -> tuple[Any, str | None]:
        """The object stored at ``path`` if it is a ``kind``; else None, and a warning when
        something unreadable was there (it is removed, to be rebuilt)."""
        if not path.is_file():
            return None, None
        try:
            with path.open("rb") as handle:
                found = pickle.load(handle)  # our own file, written by _write
        except (
            OSError,
            pickle.UnpicklingError,
            EOFError,
            AttributeError,
            ValueError,
            TypeError,
            ImportError,
        ):
            found = None
        if isinstance(found, kind):
            return found, None
        path.unlink(missing_ok=True)
        return None, f"the cached backtest {path.name} was unreadable: rebuilt"

    def _write(self, path: Path, value: object) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
        with tmp.open("wb") as handle:
            pickle.dump(value, handle)
        tmp.replace(path)  # atomic: a concurrent reader never sees half a file

    def load(
        self, anchor: str, fraction: float, file_weight: float
    ) -> tuple[RankingChoice | None, str | None]:
        """The stored choice, or None; and a warning when a stored one was unreadable."""
        found, warning = self._read(self._path(anchor, fraction, file_weight), RankingChoice)
        return found, warning

    def store(self, choice: RankingChoice, file_weight: float) -> None:
        self._write(self._path(choice.anchor, choice.fraction, file_weight), choice)

    def load_agent(self, name: str, anchor: str) -> tuple[AgentVerdict | None, str | None]:
        """The agent's verdict measured at ``anchor``, or None."""
        found, warning = self._read(self.folder / f"agent-{name}-{anchor}.pickle", AgentVerdict)
        return found, warning

    def store_agent(self, anchor: str, verdict: AgentVerdict) -> None:
        self._write(self.folder / f"agent-{verdict.agent}-{anchor}.pickle", verdict)
