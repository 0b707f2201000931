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

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from test_selection.coverage.map import CoverageIndex
from test_selection.coverage.select import PastReach, past_reach
from test_selection.git import GitError, Repo
from test_selection.ranking.agent_check import AgentVerdict
from test_selection.ranking.allocation import (
    FILE_WEIGHT,
    MODEL,
    REACHED_FILES,
    REACHED_FIRST,
    SPREAD,
    WHOLE,
    Calibration,
)
from test_selection.ranking.cases import (
    Case,
    build_cases,
    case_sweeps,
    replay_case,
    with_reach,
)
from test_selection.ranking.figures import Figures
from test_selection.ranking.history import History
from test_selection.ranking.inputs import RankingInputs
from test_selection.ranking.learned import Ranker, fit
from test_selection.ranking.model_replay import ModelReplay, files_to_read, replay_model
from test_selection.ranking.rankers import (
    Blend,
    CoverageBoost,
    FileRanker,
    HistoryCounting,
    LearnedRanking,
    WordsRanking,
    boost,
)
from test_selection.ranking.replay import buckets, evaluate, ranked, shared_calibration
from test_selection.ranking.test_model import TestModel, TestText

MIN_CASES = 12  # fewer: too little history to choose, the prior ranking is used

REFIT_EVERY = 50  # commits of history an anchor serves

TIE = 0.005  # a candidate must beat the earlier (simpler) ones by this much

# the winner may not find fewer edited test files, or fewer edited tests, than history
# counting taking whole files (the plain baseline) did on the same commits, by more than
TOLERANCE = 0.02


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
    sweeps: bool = False  # the backtest found more with sweeps run whole (sweeps.py)

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
            "sweeps": self.sweeps,
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


# per case: the candidate's file order and each file's rank bucket
Ranked = list[tuple[list[str], dict[str, int]]]


@dataclass
class _Replays:
    """Every candidate's file order on every case, as ranked and with the files the map
    reaches moved up (``boosted``, only with a map)."""

    names: list[str]
    descriptions: dict[str, str]
    plain: dict[str, Ranked]
    boosted: dict[str, Ranked]


@dataclass
class _Backtest:
    """One backtest under way: its cases and budget, and what it has measured so far."""

    cases: list[Case]
    sizes: Mapping[str, int]
    shared: Calibration
    fraction: float
    file_weight: float
    figures: list[Figures] = field(default_factory=list)  # without the map
    with_map: list[Figures] = field(default_factory=list)
    calibrations: dict[str, Calibration] = field(default_factory=dict)  # by Figures.key
    models: dict[str, TestModel] = field(default_factory=dict)  # by coverage use
    # by Figures.key: what its replay was given, to replay it again with sweeps
    given: dict[str, tuple[Ranked, dict[str, Any]]] = field(default_factory=dict)

    def measure(
        self,
        ranked_cases: Ranked,
        name: str,
        description: str,
        allocation: str,
        use: str = "",
        *,
        cases: Sequence[Case] | None = None,
        shared: Calibration | None = None,
        reached: Sequence[Mapping[str, int]] | None = None,
        replay: ModelReplay | None = None,
    ) -> None:
        """Replay one candidate under one budget rule and keep its figures."""
        given = {
            "cases": self.cases if cases is None else cases,
            "shared": self.shared if shared is None else shared,
            "allocation": allocation,
            "reached": reached,
            "replay": replay,
        }
        file_recall, test_recall, calibration = self._evaluate(ranked_cases, given)
        fig = Figures(name, description, file_recall, test_recall, allocation, use)
        (self.with_map if use else self.figures).append(fig)
        self.calibrations[fig.key] = calibration
        self.given[fig.key] = (ranked_cases, given)

    def _evaluate(
        self,
        ranked_cases: Ranked,
        given: Mapping[str, Any],
        sweeps: Sequence[Sequence[str]] | None = None,
    ) -> tuple[float, float, Calibration]:
        return evaluate(
            ranked_cases,
            given["cases"],
            self.sizes,
            given["shared"],
            self.fraction,
            self.file_weight,
            given["allocation"],
            given["reached"],
            given["replay"],
            sweeps,
        )

    def with_sweeps(self, best: Figures, sweeps: Sequence[Sequence[str]]) -> Figures:
        """The winner replayed again with each case's sweeps run whole first."""
        ranked_cases, given = self.given[best.key]
        file_recall, test_recall, _calibration = self._evaluate(ranked_cases, given, sweeps)
        fig = replace(best, file_recall=file_recall, test_recall=test_recall, sweeps=True)
        (self.with_map if best.coverage else self.figures).append(fig)
        self.calibrations[fig.key] = self.calibrations[best.key]
        return fig


def choose(
    repo: Repo,
    history: History,
    anchor: int,
    inputs: RankingInputs,
    fraction: float,
    file_weight: float = FILE_WEIGHT,
    only: str | None = None,
) -> RankingChoice:
    """Replay the candidates on the commits up to ``anchor`` and return the winner (or the
    one named by ``only``), with its measured calibration. ``inputs.tokens``: each test
    file's tests' tokens now (the replayed commits' own test files are read as they were).
    With a map, every candidate is replayed again with the tests the map says each
    commit's change executed first in their files (and once more with their files moved
    up); such a variant wins only if it finds no fewer edited files and tests than the
    winner without the map, and more of both together. ``inputs.texts``: each test file's
    tests now, for the test model (``test_model.py``): without them it is not replayed."""
    started = time.perf_counter()
    files = sorted(inputs.sizes)
    cases = build_cases(repo, history, anchor, set(files), inputs.is_test)
    anchor_sha = history.shas[anchor] if 0 <= anchor < len(history.shas) else ""
    if len(cases) < MIN_CASES:
        return _too_little_history(len(cases), anchor, anchor_sha, fraction, started)
    rows: dict[int, list[list[float]]] = {}  # shared by both fits
    fitted, notes = _fit_before(
        history, files, inputs, min(c.index for c in cases), anchor, only, rows
    )
    coverage = inputs.coverage
    reach = _past_reach(coverage, repo, history, cases)
    replays = _replay_rankings(history, cases, files, inputs, fitted, only, reach)
    backtest = _Backtest(cases, inputs.sizes, shared_calibration(cases), fraction, file_weight)
    for allocation in (WHOLE, SPREAD):
        for name in replays.names:
            backtest.measure(replays.plain[name], name, replays.descriptions[name], allocation)
    read = _measure_model(backtest, replays, inputs.texts)
    if coverage is not None:
        _measure_with_map(backtest, replays, reach, inputs.texts, read)
    best = _pick(backtest.figures, backtest.with_map)
    best = _sweeps(backtest, best, [case_sweeps(c, inputs.tokens) for c in cases])
    live = None
    if "learned" in best.name:
        live, _why = fit(
            history, files, inputs.imports, inputs.is_test, until=anchor + 1, rows_cache=rows
        )
        if live is None:  # cannot happen when the earlier fit worked; stay safe
            best = backtest.figures[0]
    reason = _reason(backtest, anchor_sha, coverage, reach)
    figures = backtest.figures + (backtest.with_map if coverage is not None else [])
    return RankingChoice(
        best.name,
        best.label,
        backtest.calibrations[best.key],
        live,
        figures,
        len(cases),
        anchor_sha,
        fraction,
        "; ".join([reason, *notes]),
        time.perf_counter() - started,
        allocation=best.allocation,
        coverage=best.coverage,
        test_model=backtest.models.get(best.coverage) if best.allocation == MODEL else None,
        sweeps=best.sweeps,
    )


def _too_little_history(
    cases: int, anchor: int, anchor_sha: str, fraction: float, started: float
) -> RankingChoice:
    """History counting with prior numbers: too few past commits to replay."""
    counting = HistoryCounting()
    return RankingChoice(
        counting.name,
        counting.description,
        Calibration.prior(),
        cases=cases,
        anchor=anchor_sha,
        fraction=fraction,
        reason=(
            f"too little history to choose a ranking: {cases} commit(s) in the last "
            f"{anchor + 1} changed source and existing tests together ({MIN_CASES} needed); "
            f"{counting.description} ranks with prior numbers"
        ),
        seconds=time.perf_counter() - started,
    )


def _fit_before(
    history: History,
    files: list[str],
    inputs: RankingInputs,
    start: int,
    anchor: int,
    only: str | None,
    rows: dict[int, list[list[float]]],
) -> tuple[Ranker | None, list[str]]:
    """The learned model fitted on the commits before the replayed ones (a time split),
    and what to say when it could not be."""
    notes = []
    fitted, why = fit(history, files, inputs.imports, inputs.is_test, until=start, rows_cache=rows)
    if fitted is None and only in ("learned", "blend", "learned+words"):
        # asked for by name: learn from the replayed commits too (its figures flatter it)
        fitted, why = fit(
            history, files, inputs.imports, inputs.is_test, until=anchor + 1, rows_cache=rows
        )
        if fitted is not None:
            notes.append("the learned model was fitted on the replayed commits themselves")
    if fitted is None:
        notes.append(f"the learned model could not be fitted before the backtest ({why})")
    return fitted, notes


def _past_reach(
    coverage: CoverageIndex | None, repo: Repo, history: History, cases: Sequence[Case]
) -> PastReach:
    """What the map says each case's Python source change reached (nothing without one)."""
    if not coverage:
        return {}
    python = {p for c in cases for p in c.sources if p.endswith(".py")}
    changes = [
        (c.sha, {p: b for p, b in history.modified[c.index].items() if p in python}) for c in cases
    ]
    return past_reach(coverage, repo, changes)


def _replay_rankings(
    history: History,
    cases: Sequence[Case],
    files: list[str],
    inputs: RankingInputs,
    fitted: Ranker | None,
    only: str | None,
    reach: PastReach,
) -> _Replays:
    """Each candidate's file order on each case, with the case's own words over the tests
    as they were before it."""
    names = list(candidates(fitted, inputs.imports, frozenset(), {}))
    if only is not None:
        names = [n for n in names if n == only] or ["history"]
    replays = _Replays(names, {}, {n: [] for n in names}, {n: [] for n in names})
    for case in cases:
        before = {**inputs.tokens, **case.before}
        made = candidates(fitted, inputs.imports, case.words, before)
        best_reach = {
            f: max(r.specificity for r in tests.values())
            for f, tests in reach.get(case.sha, {}).items()
        }
        for name in names:
            scores = made[name].rank(history, case.index, set(case.sources), files)
            order = ranked(scores, files)
            replays.plain[name].append((order, buckets(scores, order)))
            replays.descriptions[name] = made[name].description
            if inputs.coverage is not None:
                moved = boost(scores, best_reach, files)
                order = ranked(moved, files)
                replays.boosted[name].append((order, buckets(moved, order)))
    return replays


def _measure_model(
    backtest: _Backtest, replays: _Replays, texts: Mapping[str, Sequence[TestText]] | None
) -> list[set[str]]:
    """The test model replayed out of fold under every candidate's file order; returns,
    per case, the files its replay read (the map's replay reads the same)."""
    if texts is None:
        return []
    cases, sizes = backtest.cases, backtest.sizes
    total = sum(sizes.values())
    read = [
        files_to_read(
            [
                orders[name][k][0]
                for name in replays.names
                for orders in (replays.plain, replays.boosted)
                if orders[name]
            ],
            sizes,
            backtest.fraction * total,
        )
        for k in range(len(cases))
    ]
    plain = replay_model([replay_case(c, None) for c in cases], texts, read, False)
    if plain is not None and plain.model is not None:
        backtest.models[""] = plain.model
        for name in replays.names:
            backtest.measure(
                replays.plain[name], name, replays.descriptions[name], MODEL, replay=plain
            )
    return read


def _measure_with_map(
    backtest: _Backtest,
    replays: _Replays,
    reach: PastReach,
    texts: Mapping[str, Sequence[TestText]] | None,
    read: list[set[str]],
) -> None:
    """Every candidate again with the map: the tests it says executed the change first,
    then also their files moved up; and the test model reading the map."""
    pairs = [with_reach(case, reach.get(case.sha, {})) for case in backtest.cases]
    reached_cases = [case for case, _counts in pairs]
    counts = [counts for _case, counts in pairs]
    reached_shared = shared_calibration(reached_cases, counts)
    uses = ((REACHED_FIRST, replays.plain), (REACHED_FILES, replays.boosted))
    for use, orders in uses:
        for allocation in (WHOLE, SPREAD):
            for name in replays.names:
                backtest.measure(
                    orders[name],
                    name,
                    replays.descriptions[name],
                    allocation,
                    use,
                    cases=reached_cases,
                    shared=reached_shared,
                    reached=counts,
                )
    if texts is None:
        return
    cases = [replay_case(c, reach.get(c.sha, {})) for c in backtest.cases]
    mapped = replay_model(cases, texts, read, True)
    if mapped is None or mapped.model is None:
        return
    backtest.models[REACHED_FIRST] = backtest.models[REACHED_FILES] = mapped.model
    for use, orders in uses:
        for name in replays.names:
            backtest.measure(
                orders[name], name, replays.descriptions[name], MODEL, use, replay=mapped
            )


def _pick(figures: Sequence[Figures], with_map: Sequence[Figures]) -> Figures:
    """The winner. The plain baseline (history counting, whole files) comes first: ties go
    to it, and nothing that falls short of it on either figure is taken; a variant with the
    map must also find no fewer of either than the winner without it."""
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
    return best


def _sweeps(backtest: _Backtest, best: Figures, sweeps: list[tuple[str, ...]]) -> Figures:
    """The winner with sweeps run whole (``sweeps.py``) when that finds more of both
    together on the same commits, losing no more than ``TOLERANCE`` of edited test files;
    else the winner as it is. Whole files already run whole: nothing to replay."""
    if best.allocation == WHOLE or not any(sweeps):
        return best
    swept = backtest.with_sweeps(best, sweeps)
    if swept.file_recall >= best.file_recall - TOLERANCE and swept.objective > best.objective + TIE:
        return swept
    return best


def _reason(
    backtest: _Backtest, anchor_sha: str, coverage: CoverageIndex | None, reach: PastReach
) -> str:
    """What every candidate found, as the plan states why its ranking was chosen."""
    cases = backtest.cases
    reason = (
        f"chosen by backtest on {len(cases)} past commit(s) up to {anchor_sha[:12]} at "
        f"{backtest.fraction:.0%} of the tests: "
        + "; ".join(
            f"{f.label} found {f.file_recall:.0%} of edited test files, "
            f"{f.test_recall:.0%} of edited tests"
            for f in backtest.figures
        )
    )
    if backtest.with_map and coverage is not None:
        top = max(backtest.with_map, key=lambda f: f.objective)
        known = sum(1 for case in cases if reach.get(case.sha))
        reason += (
            f"; with the coverage map of {coverage.map.revision[:12]} ({known} of "
            f"{len(cases)} commit(s) changed a function it knows), at best {top.label} found "
            f"{top.file_recall:.0%} of edited test files, {top.test_recall:.0%} of edited tests"
        )
    return reason


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
