"""The chosen ranking applied to the change at hand: every universe test's value, with why.

The backtest (``choice.py``) picked a ranking and a budget rule on past commits; this reads
the live change as the backtest read those (its words, its terms for the test model, the
map's reach) and gives each test the value the plan spends the budget by, with the sentence
the plan shows for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from test_selection.change_analysis import ChangeAnalysis
from test_selection.coverage.select import reached_first
from test_selection.inventory import TestFunction
from test_selection.ranking import rules
from test_selection.ranking.agent_check import Similarity, blend_orders
from test_selection.ranking.allocation import MODEL, SPREAD, idf_order
from test_selection.ranking.choice import RankingChoice
from test_selection.ranking.history import History
from test_selection.ranking.inputs import RankingInputs
from test_selection.ranking.model_replay import chance_order, reached_tests
from test_selection.ranking.replay import buckets, ranked
from test_selection.ranking.rules import FileSlot
from test_selection.ranking.test_model import ChangeTerms, TestText, change_terms, file_features
from test_selection.test_bodies import diff_words, telling
from test_selection.types import Evidence, TestId

AGENT_FILES = 30  # an agent that runs reorders the tests of this many top-ranked files,
AGENT_LIVE_TEXTS = 600  # reading at most this many tests (embeddings are kept across calls)


def change_words(change: ChangeAnalysis) -> frozenset[str]:
    """The words the backtest reads in past changes: their changed and hunk-context lines."""
    return diff_words(
        line for f in change.source_files for line in (*f.contexts, *f.removed, *f.added)
    )


def live_terms(change: ChangeAnalysis, words: frozenset[str]) -> ChangeTerms:
    """The change's terms for the test model, read as the backtest reads a past change."""
    files = change.source_files
    return change_terms(
        words,
        [c for f in files for c in f.contexts],
        [line for f in files for line in f.removed],
        [line for f in files for line in f.added],
    )


def test_texts(tests: Sequence[TestFunction]) -> list[TestText]:
    """What the test model reads of a file's tests (named as the backtest names them)."""
    return [
        TestText(f"{fn.id.cls}::{fn.id.name}" if fn.id.cls else fn.id.name, fn.tokens, fn.lines)
        for fn in tests
    ]


def ranked_evidence(
    choice: RankingChoice,
    history: History,
    change: ChangeAnalysis,
    by_file: Mapping[str, list[TestFunction]],
    inputs: RankingInputs,
    file_weight: float,
    similarity: Similarity | None = None,
) -> dict[TestId, Evidence]:
    """Every universe test's value under the chosen ranking (``allocation.py``), with why.
    With ``similarity`` (an agent that earned its place) the top files' word order is
    blended with what the agent reads in the change."""
    files = sorted(by_file)
    sources = {f.path for f in change.source_files} | {
        f.old_path for f in change.source_files if f.old_path
    }
    words = change_words(change)
    reach = inputs.reach if choice.candidate.map_use else None
    model = choice.test_model if choice.candidate.rule == MODEL else None
    terms = live_terms(change, words) if model is not None else None
    best_reach: dict[str, float] = {}
    for test, found in (reach or {}).items():
        best_reach[test.file] = max(best_reach.get(test.file, 0.0), found.specificity)
    scores = choice.ranker(inputs.imports, words, inputs.tokens, best_reach).rank(
        history, len(history.files), sources, files, True
    )
    order = ranked(scores, files)
    file_buckets = buckets(scores, order)
    calibration = choice.calibration
    hunks = [
        f"{f.path}\n{f.hunk_text}" for f in (change.source_files or change.files) if f.hunk_text
    ][:20]
    out: dict[TestId, Evidence] = {}
    agent_texts = AGENT_LIVE_TEXTS  # what the agent may read for this change
    for rank, path in enumerate(order):
        tests = by_file[path]
        n = len(tests)
        p = calibration.p_file(file_buckets[path])
        reaches = [reach.get(fn.id) for fn in tests] if reach else []
        first = sum(1 for r in reaches if r is not None)
        within, word_scores = idf_order([(fn.tokens, fn.lines) for fn in tests], words)
        said: list[str] = []
        chances = None
        if model is not None and terms is not None:
            texts = test_texts(tests)
            live = reach or {}
            by_name = (
                {t.name: live[fn.id] for t, fn in zip(texts, tests, strict=True) if fn.id in live}
                if model.coverage
                else None
            )
            rows = file_features(texts, terms, word_scores, within, reached_tests(texts, by_name))
            found = model.probabilities(rows)
            within = chance_order(found, within)
            chances = found[within]
            said = [
                f", {found[i]:.0%} likely edited if its file is"
                + (f" ({'; '.join(top)})" if (top := model.strongest(rows[i])) else "")
                for i in within
            ]
        rule = choice.candidate.rule
        if rule == MODEL and chances is None:  # no model fitted: the spread rule, as replayed
            rule = SPREAD
        slot = FileSlot(path, rank, p, n, first, chances)
        values = rules.values(rule, slot, calibration, file_weight)
        if model is None and similarity is not None and rank < AGENT_FILES and 1 < n <= agent_texts:
            within = blend_orders(within, similarity(hunks, [fn.source for fn in tests]))
            agent_texts -= n
        if model is None and first:
            within = reached_first(within, reaches)
        why = scores.reasons.get(path)
        head = (
            f"{path} is #{rank + 1} of {len(files)} by {choice.description}"
            + (f" ({why})" if why else " (no evidence)")
            + f", {p:.0%} likely reached"
        )
        for position, index in enumerate(within):
            fn = tests[index]
            shared = telling(sorted(fn.tokens & words)) if word_scores[index] > 0 else []
            detail = (
                f"; test #{position + 1} of {n} in its file"
                + (said[position] if said else "")
                + (f", uses {', '.join(shared[:4])} from the change" if shared else "")
            )
            out[fn.id] = Evidence("candidates", "ranking", float(values[position]), head + detail)
    return out
