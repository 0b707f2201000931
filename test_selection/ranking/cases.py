"""The backtest's cases: recent commits that changed source and existing tests together.

Each case is what one past commit changed and which tests it edited, read from both
versions of every test file it modified (``git show`` for the source, one blob read for the
tests), in the within-file order the change's words give: the truth a ranking is replayed
against (``replay.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from test_selection.coverage.map import Reach
from test_selection.coverage.select import reached_first
from test_selection.git import GitError, Repo
from test_selection.ranking.allocation import (
    idf_order,
)
from test_selection.ranking.history import History
from test_selection.ranking.model_replay import ReplayCase
from test_selection.ranking.test_model import ChangeTerms, TestText, change_terms
from test_selection.sweeps import MIN_TESTS, is_sweep, sweep_names
from test_selection.test_bodies import diff_words, split_tests

log = logging.getLogger("test_selection.backtest")


BACKTEST_CASES = 60  # the most recent commits replayed

MAX_CASE_FILES = 60  # a larger commit is a sweep, not a change and its tests


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
class CaseDiff:
    """One case's source change as read from ``git show -U0``."""

    lines: list[str]  # hunk headers and changed lines, in the diff's order
    hunks: list[str]  # per file, ``path`` then its changed lines (what an agent reads)
    contexts: list[str]
    removed: list[str]
    added: list[str]


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


def _case_words(
    repo: Repo, history: History, indexes: list[int], sources: set[str]
) -> dict[str, tuple[frozenset[str], ChangeTerms]]:
    """The words of each case's source change, and its terms for the test model."""
    diffs = case_diffs(repo, history, indexes, sources)
    out = {}
    for sha, diff in diffs.items():
        words = diff_words(diff.lines)
        out[sha] = (words, change_terms(words, diff.contexts, diff.removed, diff.added))
    return out


def case_diffs(
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


def replay_case(case: Case, reach: Mapping[str, Mapping[str, Reach]] | None) -> ReplayCase:
    return ReplayCase(
        case.terms or change_terms(case.words, [], [], []),
        case.texts,
        case.edited_at,
        reach,
    )


def case_sweeps(case: Case, tokens: Mapping[str, Sequence[frozenset[str]]]) -> tuple[str, ...]:
    """The test files a past case would have run whole as a sweep (``sweeps.py``: most of
    their tests use a def the change touched), the most reached share first, as the plan
    takes them; its own test files as they were before it, the others as they are now."""
    names = frozenset(sweep_names(case.terms.defs if case.terms is not None else ()))
    if not names:
        return ()
    found = []
    for path, tests in {**tokens, **case.before}.items():
        if len(tests) < MIN_TESTS:
            continue
        reached = sum(1 for toks in tests if names & toks)
        if is_sweep(reached, len(tests)):
            found.append((-reached / len(tests), len(tests), path))
    return tuple(path for _share, _n, path in sorted(found))
