"""The four stages end to end: change analysis -> candidates -> agent review -> plan."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from reuse_specs.loader import LoadedSpec, load_specs
from reuse_specs.matching import TestVariant, decide
from reuse_specs.modes import Mode
from reuse_specs.upstream_check import find_drift
from test_selection.agents import Agent, NoAgent, Review
from test_selection.candidates import Context, Heuristic, collect_evidence, default_heuristics
from test_selection.change_analysis import ChangeAnalysis, analyze
from test_selection.git import Repo
from test_selection.inventory import Inventory, build_inventory, default_cache_dir, is_test_path
from test_selection.layout import EmptyUniverse, Layout, detect_layout
from test_selection.learned import UNSURE, FileRanking, TooLittleHistory, rank_files
from test_selection.observations import Learned, Observation, learn
from test_selection.plan import durations_for, make_plan
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
    history_commits: int = 2000
    # past results of this backend (the relay's): learned durations, failures, flakes
    observations: tuple[Observation, ...] = ()
    learn: bool = True  # rank test files with weights learned from the repository's history
    label: str | None = None  # spec entries without this label are skipped (not in the universe)


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


LEARNED_SIGNALS = frozenset({"co-change", "path-keywords"})


def _learned_ranking(
    repo: Repo,
    change: ChangeAnalysis,
    inventory: Inventory,
    universe: set[TestId],
    layout: Layout,
    config: SelectorConfig,
) -> FileRanking | None:
    """The repository's learned ranking of the universe's test files, or None (and a note
    why) when its history is too short: then the hand weights rank them."""
    files = sorted({t.file for t in universe})
    imports = {p: set(f.imports) for p, f in inventory.files.items()}
    sources = {f.path for f in change.source_files} | {
        f.old_path for f in change.source_files if f.old_path
    }
    roots = repo.text("rev-list", "--max-parents=0", "--end-of-options", change.base).split()
    key = f"{','.join(sorted(roots))}|{'|'.join(layout.patterns)}"
    try:
        return rank_files(
            repo,
            change.base,
            sources,
            files,
            imports,
            lambda path: is_test_path(path, layout.patterns),
            config.cache_dir,
            key,
        )
    except TooLittleHistory as why:
        change.parse_errors.append(str(why))
        return None


def _review(
    agent: Agent,
    change: ChangeAnalysis,
    scored: dict[TestId, Scored],
    inventory: Inventory,
    learned_files: FileRanking | None,
) -> Review:
    """The agent reviews where it can add information: every candidate under the hand
    weights, and only the tests of files the learned ranking is unsure of when it is in
    charge (the bench measured the agent adding little elsewhere, at several times the cost)."""
    if learned_files is None or isinstance(agent, NoAgent):
        return agent.review(change, scored, inventory)
    unsure = {t: s for t, s in scored.items() if learned_files.is_unsure(t.file) or s.mandatory}
    before = {t: len(s.evidence) for t, s in unsure.items()}
    review = agent.review(change, unsure, inventory)
    ceiling = UNSURE[1]
    for test, item in unsure.items():
        # reorder within the unsure band only: never above a file the model is sure of
        room = max(0.0, ceiling - learned_files.scores.get(test.file, 0.0))
        for k in range(before[test], len(item.evidence)):
            evidence = item.evidence[k]
            if evidence.score > room:
                item.evidence[k] = replace(evidence, score=room)
            room -= item.evidence[k].score
    review.notes.append(
        f"the {review.agent} agent reviewed the {len(unsure)} of {len(scored)} test(s) whose "
        "files the learned ranking is unsure of; the learned ranking decides the rest"
    )
    return review


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
    learned_files = None
    heuristics = config.heuristics
    if config.learn and heuristics is None:
        learned_files = _learned_ranking(repo, change, inventory, universe, layout, config)
        if learned_files is not None:  # it has co-change and path words inside
            heuristics = [h for h in default_heuristics() if h.name not in LEARNED_SIGNALS]
            notes.append(learned_files.note)
    lap("learned")
    evidence = collect_evidence(change, inventory, ctx, heuristics)
    if learned_files is not None:
        for test in universe:
            if test.file in learned_files.scores:
                evidence.setdefault(test, []).append(
                    Evidence(
                        "candidates",
                        "learned",
                        learned_files.scores[test.file],
                        learned_files.reasons[test.file],
                    )
                )
    scored = {
        t: Scored(t, list(evidence.get(t, []))) for t in sorted(universe, key=lambda t: t.sort_key)
    }
    lap("candidates")
    review = _review(config.agent, change, scored, inventory, learned_files)
    lap("agent")
    durations = durations_for(
        list(scored), config.file_seconds, {**config.learned_seconds, **learned.seconds}
    )
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
    )
    return plan, change
