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
    WHOLE,
    Calibration,
)
from test_selection.ranking.candidate import PRIOR, REGISTRY, Candidate
from test_selection.ranking.cases import (
    Case,
    build_cases,
    case_sweeps,
)
from test_selection.ranking.figures import Figures
from test_selection.ranking.history import History
from test_selection.ranking.inputs import RankingInputs
from test_selection.ranking.learned import Ranker, fit
from test_selection.ranking.rankers import (
    Blend,
    CoverageBoost,
    FileRanker,
    HistoryCounting,
    LearnedRanking,
    WordsRanking,
    boost,
)
from test_selection.ranking.replay import (
    buckets,
    evaluate,
    plan_case,
    ranked,
)
from test_selection.ranking.settings import Replays, Setting, Settings
from test_selection.ranking.test_model import TestModel

MIN_CASES = 12  # fewer: too little history to choose, the prior ranking is used

REFIT_EVERY = 50  # commits of history an anchor serves

TIE = 0.005  # a candidate must beat the earlier (simpler) ones by this much

# the winner may not find fewer edited test files, or fewer edited tests, than history
# counting taking whole files (the plain baseline) did on the same commits, by more than
TOLERANCE = 0.02


@dataclass
class RankingChoice:
    """The candidate a plan uses, why, and the numbers it spends the budget with."""

    candidate: Candidate
    description: str
    calibration: Calibration
    learned: Ranker | None = None  # fitted up to the anchor, when the candidate needs it
    figures: list[Figures] = field(default_factory=list)
    cases: int = 0
    anchor: str = ""
    fraction: float = 0.15
    reason: str = ""
    seconds: float = 0.0
    agent: AgentVerdict | None = None  # set by the selector (measured apart, cached apart)
    test_model: TestModel | None = None  # with the MODEL rule: fitted up to the anchor

    @property
    def measured(self) -> bool:
        """Chosen by the backtest (not prior numbers on too little history)."""
        return self.cases >= MIN_CASES

    def ranker(
        self,
        imports: dict[str, set[str]],
        words: frozenset[str],
        tokens: Mapping[str, Sequence[frozenset[str]]],
        reach: Mapping[str, float] | None = None,
    ) -> FileRanker:
        """The chosen ranking, for a change with these words over tests with these tokens
        (and, where the choice moves them up, the files a coverage map reaches)."""
        made = rankers(self.learned, imports, words, tokens)
        chosen = made.get(self.candidate.ranker) or made["history"]
        if self.candidate.map_use == REACHED_FILES and reach:
            return CoverageBoost(chosen, reach)
        return chosen

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.candidate.ranker,
            "allocation": self.candidate.rule,
            "coverage": self.candidate.map_use,
            "description": self.description,
            "reason": self.reason,
            "backtest_commits": self.cases,
            "anchor": self.anchor,
            "budget_fraction": round(self.fraction, 4),
            "sweeps": self.candidate.sweeps,
            "candidates": [f.to_json() for f in self.figures],
            "agent": self.agent.note() if self.agent else None,
        }


def rankers(
    fitted: Ranker | None,
    imports: dict[str, set[str]],
    words: frozenset[str],
    tokens: Mapping[str, Sequence[frozenset[str]]],
) -> dict[str, FileRanker]:
    """Every ranker (those needing the learned model only with a fit), by name, in the
    order a tie goes to (``candidate.RANKERS``)."""
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


@dataclass
class _Backtest:
    """One backtest under way: its cases and budget, and what it has measured so far."""

    cases: list[Case]
    sizes: Mapping[str, int]
    fraction: float
    file_weight: float
    figures: list[Figures] = field(default_factory=list)  # without the map
    with_map: list[Figures] = field(default_factory=list)
    calibrations: dict[str, Calibration] = field(default_factory=dict)  # by Figures.key
    models: dict[str, TestModel] = field(default_factory=dict)  # by coverage use
    given: dict[str, Setting] = field(default_factory=dict)  # by Figures.key

    def measure(self, candidate: Candidate, description: str, setting: Setting) -> None:
        """Replay one candidate and keep its figures."""
        file_recall, test_recall, calibration = self._evaluate(candidate, setting)
        fig = Figures(candidate, description, file_recall, test_recall)
        (self.with_map if candidate.map_use else self.figures).append(fig)
        self.calibrations[fig.key] = calibration
        self.given[fig.key] = setting

    def _evaluate(
        self,
        candidate: Candidate,
        setting: Setting,
        sweeps: Sequence[Sequence[str]] | None = None,
    ) -> tuple[float, float, Calibration]:
        return evaluate(
            setting.orders[candidate.ranker],
            setting.cases,
            self.sizes,
            setting.shared,
            self.fraction,
            self.file_weight,
            candidate.rule,
            setting.reached,
            setting.replay,
            sweeps,
        )

    def with_sweeps(self, best: Figures, sweeps: Sequence[Sequence[str]]) -> Figures:
        """The winner replayed again with each case's sweeps run whole first."""
        swept = best.candidate.swept()
        file_recall, test_recall, _calibration = self._evaluate(swept, self.given[best.key], sweeps)
        fig = replace(best, candidate=swept, file_recall=file_recall, test_recall=test_recall)
        (self.with_map if swept.map_use else self.figures).append(fig)
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
    registry: Sequence[Candidate] = REGISTRY,
) -> RankingChoice:
    """Replay the candidates of ``registry`` on the commits up to ``anchor`` and return
    the winner (among those of the ranker named by ``only``, when given), with its measured
    calibration. ``inputs.tokens``: each test file's tests' tokens now (the replayed
    commits' own test files are read as they were). With a map, the candidates that use it
    are replayed too; such a one wins only if it finds no fewer edited files and tests than
    the winner without the map, and more of both together. ``inputs.texts``: each test
    file's tests now, for the test model (``test_model.py``): without them the MODEL rule
    is not replayed. A candidate on trial is replayed and reported, never chosen."""
    started = time.perf_counter()
    files = sorted(inputs.sizes)
    cases = build_cases(repo, history, anchor, set(files), inputs.is_test)
    anchor_sha = history.shas[anchor] if 0 <= anchor < len(history.shas) else ""
    if len(cases) < MIN_CASES:
        why = (
            f"too little history to choose a ranking: {len(cases)} commit(s) in the last "
            f"{anchor + 1} changed source and existing tests together ({MIN_CASES} needed)"
        )
        prior = prior_choice(why, anchor_sha, fraction, inputs.coverage is not None, len(cases))
        prior.seconds = time.perf_counter() - started
        return prior
    rows: dict[int, list[list[float]]] = {}  # shared by both fits
    fitted, notes = _fit_before(
        history, files, inputs, min(c.index for c in cases), anchor, only, rows
    )
    coverage = inputs.coverage
    reach = _past_reach(coverage, repo, history, cases)
    replays = _replay_rankings(history, cases, files, inputs, fitted, only, reach)
    backtest = _Backtest(cases, inputs.sizes, fraction, file_weight)
    settings = Settings(backtest, replays, reach, inputs.texts, coverage is not None)
    for candidate in registry:
        setting = settings.get(candidate) if candidate.ranker in replays.names else None
        if setting is not None:
            backtest.measure(candidate, replays.descriptions[candidate.ranker], setting)
    best = _pick(backtest.figures, backtest.with_map)
    best = _sweeps(backtest, best, [case_sweeps(c, inputs.tokens) for c in cases])
    live = None
    if best.candidate.learned:
        live, _why = fit(
            history, files, inputs.imports, inputs.is_test, until=anchor + 1, rows_cache=rows
        )
        if live is None:  # cannot happen when the earlier fit worked; stay safe
            best = (backtest.figures or backtest.with_map)[0]
    reason = _reason(backtest, anchor_sha, coverage, reach)
    figures = backtest.figures + (backtest.with_map if coverage is not None else [])
    chosen = best.candidate
    return RankingChoice(
        chosen,
        best.label,
        backtest.calibrations[best.key],
        live,
        figures,
        len(cases),
        anchor_sha,
        fraction,
        "; ".join([reason, *notes]),
        time.perf_counter() - started,
        test_model=backtest.models.get(chosen.map_use) if chosen.rule == MODEL else None,
    )


def replay_commit(
    repo: Repo,
    history: History,
    anchor: int,
    inputs: RankingInputs,
    candidate: Candidate,
    sha: str,
    plan: RankingChoice,
    file_weight: float = FILE_WEIGHT,
) -> dict[str, int]:
    """How many tests of each file the backtest's replay of the past commit ``sha`` takes
    under ``candidate``, spending the budget with the numbers of the live ``plan`` (its
    calibration, its fitted models) instead of those measured on the other commits: what
    selecting that commit live must take, file by file (``tests/test_replay_live.py``)."""
    files = sorted(inputs.sizes)
    built = build_cases(repo, history, anchor, set(files), inputs.is_test)
    cases = [c for c in built if c.sha == sha]
    if not cases:
        raise ValueError(f"{sha} is not among the commits replayed at this anchor")
    reach = _past_reach(inputs.coverage, repo, history, cases)
    replays = _replay_rankings(history, cases, files, inputs, plan.learned, candidate.ranker, reach)
    backtest = _Backtest(cases, inputs.sizes, plan.fraction, file_weight)
    has_map = inputs.coverage is not None
    settings = Settings(backtest, replays, reach, inputs.texts, has_map, plan.test_model)
    setting = settings.get(candidate)
    if setting is None or candidate.ranker not in replays.names:
        raise ValueError(f"{candidate.key} cannot be replayed with these inputs")
    order, file_buckets = setting.orders[candidate.ranker][0]
    model = setting.replay if candidate.rule == MODEL else None
    return plan_case(
        setting.cases[0],
        order,
        file_buckets,
        inputs.sizes,
        plan.calibration,
        plan.fraction,
        file_weight,
        candidate.rule,
        setting.reached[0] if setting.reached is not None else None,
        model.chances[0] if model is not None else None,
        model.base if model is not None else 0.0,
    )


def prior_choice(
    why: str, anchor_sha: str, fraction: float, with_map: bool, cases: int = 0
) -> RankingChoice:
    """The ranking where none was measured (too few past commits to replay, or asked for
    by name): ``candidate.PRIOR`` spread over the files by prior numbers
    (``Calibration.prior``), the tests a coverage map reaches first in their files."""
    candidate = replace(PRIOR, map_use=REACHED_FIRST) if with_map else PRIOR
    description = rankers(None, {}, frozenset(), {})[candidate.ranker].description
    return RankingChoice(
        candidate,
        candidate.label(description),
        Calibration.prior(),
        cases=cases,
        anchor=anchor_sha,
        fraction=fraction,
        reason=f"{why}; {description} ranks with prior numbers",
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
) -> Replays:
    """Each candidate's file order on each case, with the case's own words over the tests
    as they were before it."""
    names = list(rankers(fitted, inputs.imports, frozenset(), {}))
    if only is not None:
        names = [n for n in names if n == only] or ["history"]
    replays = Replays(names, {}, {n: [] for n in names}, {n: [] for n in names})
    for case in cases:
        before = {**inputs.tokens, **case.before}
        made = rankers(fitted, inputs.imports, case.words, before)
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


def _pick(figures: Sequence[Figures], with_map: Sequence[Figures]) -> Figures:
    """The winner. The plain baseline (history counting, whole files) comes first: ties go
    to it, and nothing that falls short of it on either figure is taken; a variant with the
    map must also find no fewer of either than the winner without it."""
    if not figures:  # one candidate asked for by name, and it uses the map
        return with_map[0]
    reference = figures[0]
    best = reference
    for fig in figures[1:]:
        if (
            not fig.candidate.trial
            and fig.file_recall >= reference.file_recall - TOLERANCE
            and fig.test_recall >= reference.test_recall - TOLERANCE
            and fig.objective > best.objective + TIE
        ):
            best = fig
    without_map = best
    for fig in with_map:
        if (
            not fig.candidate.trial
            and fig.file_recall >= without_map.file_recall
            and fig.test_recall >= without_map.test_recall
            and fig.objective > best.objective + TIE
        ):
            best = fig
    return best


def _sweeps(backtest: _Backtest, best: Figures, sweeps: list[tuple[str, ...]]) -> Figures:
    """The winner with sweeps run whole (``sweeps.py``) when that finds more of both
    together on the same commits, losing no more than ``TOLERANCE`` of edited test files;
    else the winner as it is. Whole files already run whole: nothing to replay."""
    if best.candidate.rule == WHOLE or not any(sweeps):
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
            f"{f.label}{' (on trial)' if f.candidate.trial else ''} found "
            f"{f.file_recall:.0%} of edited test files, {f.test_recall:.0%} of edited tests"
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
