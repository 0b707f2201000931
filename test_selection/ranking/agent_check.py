"""Whether an agent earns its time: does its reading put past commits' edited tests earlier?

The agent (offline sentence embeddings by default) is the slow part of a selection, so it
runs only where, on the repository's own recent commits, blending its similarity into each
file's word order placed the edited tests earlier by a margin. Measured apart from the
ranking's backtest, a few hundred tests a selection, and cached apart (``cache.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from test_selection.git import Repo
from test_selection.ranking.allocation import (
    idf_order,
)
from test_selection.ranking.cases import build_cases, case_diffs
from test_selection.ranking.history import History
from test_selection.test_bodies import diff_words, split_tests

AGENT_CASES = 12  # newest commits (that edited existing tests) an agent is measured on

AGENT_TEXTS = 800  # tests of those commits' files it reads in all

AGENT_NEW_TEXTS = 200  # of which one selection reads at most this many new ones: the


# measurement spreads over a few selections instead of making one of them slow
AGENT_MARGIN = 0.05  # how much earlier (share of a file) it must place the edited tests


MIN_AGENT_TESTS = 25

AGENT_REMEASURE = 250  # the agent is measured at anchors this far apart (it is the slow part)

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
    diffs = case_diffs(repo, history, [c.index for c in sample], sources)
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
