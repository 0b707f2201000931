"""The four stages end to end: change analysis -> candidates -> agent review -> plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from reuse_specs.loader import LoadedSpec, load_specs
from reuse_specs.matching import TestVariant, decide
from reuse_specs.modes import Mode
from test_selection.agents import Agent, NoAgent
from test_selection.candidates import Context, Heuristic, collect_evidence
from test_selection.change_analysis import ChangeAnalysis, analyze
from test_selection.git import Repo
from test_selection.inventory import DEFAULT_PATTERNS, Inventory, build_inventory, default_cache_dir
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
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    cache_dir: Path = field(default_factory=default_cache_dir)
    heuristics: list[Heuristic] | None = None
    history_commits: int = 2000


def spec_universe(
    inventory: Inventory, spec: LoadedSpec | None, root: Path | None
) -> tuple[set[TestId], dict[TestId, str], list[str]]:
    """Tests the specs can run (not mode skip), their modes, and notes on unlisted ones."""
    tests = inventory.tests()
    if spec is None or root is None:
        return {t.id for t in tests}, {}, []
    universe: set[TestId] = set()
    modes: dict[TestId, str] = {}
    unlisted: list[str] = []
    for fn in tests:
        decision = decide(spec, TestVariant((root / fn.id.file).resolve(), fn.id.cls, fn.id.name))
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
    change = analyze(repo, base, head, exclude=exclude_paths, patterns=config.patterns)
    inventory = build_inventory(
        repo, inventory_rev or change.head, config.patterns, config.cache_dir
    )
    spec = load_specs(specs, upstream) if specs else None
    universe, modes, notes = spec_universe(inventory, spec, upstream.resolve() if specs else None)
    ctx = Context(
        repo,
        universe,
        config.failure_history,
        config.always_run,
        config.history_commits,
    )
    evidence = collect_evidence(change, inventory, ctx, config.heuristics)
    scored = {
        t: Scored(t, list(evidence.get(t, []))) for t in sorted(universe, key=lambda t: t.sort_key)
    }
    review = config.agent.review(change, scored, inventory)
    durations = durations_for(list(scored), config.file_seconds, config.learned_seconds)
    selected, excluded, shards, plan_notes = make_plan(
        scored, config.budget, durations, config.shards, modes
    )
    for item in selected:
        item.evidence.append(Evidence("plan", "budget", 0.0, f"within the {config.budget} budget"))
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
    )
    return plan, change
