"""What a run page shows of its selection, as plain dataclasses: each planned test with the
evidence of every stage, the ranking the backtest chose, the coverage map it used and the
spec drift of the run's revision. Rendered by the templates and the JSON API alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ci_relay.dashboard.paging import Pager


@dataclass(frozen=True)
class EvidenceItem:
    source: str
    score: float
    reason: str


@dataclass(frozen=True)
class StageEvidence:
    """What one selector stage (candidates, agent, plan) said about one test."""

    stage: str
    score: float
    items: list[EvidenceItem]


@dataclass(frozen=True)
class Variant:
    """One executed instance of a planned test (device class, dtype, op) and its outcome."""

    nodeid: str
    outcome: str


@dataclass(frozen=True)
class PlannedTestView:
    test: str
    file: str
    score: float
    mode: str | None
    shard: int | None
    duration: float
    reasons: list[str]
    stages: list[StageEvidence]
    variants: list[Variant]


@dataclass(frozen=True)
class SelectionView:
    strategy: str
    base: str | None
    head: str | None
    budget: str | None
    agent: str | None
    universe_size: int
    selected_total: int
    excluded_total: int
    shard_count: int
    notes: list[str]
    change: dict[str, Any]
    selected: list[PlannedTestView]
    selected_pager: Pager
    excluded: list[PlannedTestView]
    excluded_pager: Pager
    timings: dict[str, float] = field(default_factory=dict)  # seconds per selector stage
    shares: dict[str, float] = field(default_factory=dict)  # of tests, test files, seconds
    spec_drift: list[DriftView] = field(default_factory=list)
    ranking: RankingView | None = None
    coverage: CoverageView | None = None
    mode: str = "ranked"  # or "safe": no budget, every test the change reaches


@dataclass(frozen=True)
class CoverageView:
    """The coverage map a selection ranked with: which, how old, what it knew."""

    revision: str
    recorded_at: str
    commits_behind: int | None
    changed: int
    known: int
    tests_reached: int
    used: str = ""  # how the ranking used it
    # the coverage floor: changed functions reached by their most specific test, and not
    floor_tests: int = 0
    floor_reached: int = 0
    floor_executed: int = 0  # the other executing tests the plan took past the floor
    floor_missed: list[str] = field(default_factory=list)
    floor_skipped: str = ""


@dataclass(frozen=True)
class RankingCandidate:
    """One ranking the backtest replayed, and what it found."""

    name: str
    description: str
    file_recall: float
    test_recall: float
    chosen: bool
    trial: bool = False  # measured and shown, never chosen


@dataclass(frozen=True)
class RankingView:
    """How the plan ranked test files: the backtest's choice, why, and its figures."""

    description: str
    reason: str
    commits: int
    candidates: list[RankingCandidate]


@dataclass(frozen=True)
class DriftView:
    """A name or path a spec lists that the run's upstream revision lacks (it ran without)."""

    kind: str
    file: str
    line: int
    listed: str
    message: str
    likely: str | None
