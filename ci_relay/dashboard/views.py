"""What each dashboard page shows, as plain dataclasses.

The HTML templates and the JSON API render the same objects, so a page and its
``/api/...`` twin can never disagree about the data.

The dashboard's vocabulary, one frozen dataclass per thing a page shows and no logic beyond
small derived properties, so a template author reads every field in one place; what a run
page shows of its selection (evidence, ranking, coverage, drift) is in ``selection_views``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, TypeVar

from ci_relay.api_docs import FAILURES_CURSOR
from ci_relay.dashboard.paging import Pager
from ci_relay.dashboard.selection_views import SelectionView
from ci_relay.store.models import recoverable

V = TypeVar("V")


def from_row(view: type[V], row: Any, **computed: Any) -> V:
    """A view from a query row, copied once here for every page: each field the row has by
    name, the ones it cannot have from ``computed``; a field neither has keeps its default
    (and a required one missing is a TypeError, never a silent blank)."""
    data = row._mapping
    values = {
        f.name: computed[f.name] if f.name in computed else data[f.name]
        for f in fields(view)  # type: ignore[arg-type]
        if f.name in computed or f.name in data
    }
    return view(**values)


@dataclass(frozen=True)
class Cell:
    """The latest run of one backend on one commit."""

    run_id: int
    backend: str
    status: str
    state: str
    conclusion: str | None
    attempt: int
    runs: int  # how many runs (attempts) this commit has on this backend
    counts: dict[str, int]  # in reading order, zeros dropped
    triage: str | None = None  # the triage verdict's category, or "triaging"


@dataclass(frozen=True)
class DownstreamCell:
    """Another relay's latest result for one of its jobs on a commit (a HUD body it posted)."""

    result_id: int
    column: str  # ``verified_repo: workflow / job``
    verified_repo: str
    workflow_name: str
    job_name: str
    status: str  # the dashboard's status word, from the workflow's status and conclusion
    workflow_status: str  # in_progress | completed, as posted
    conclusion: str | None
    counts: dict[str, int]  # passed / failed / skipped as posted, in reading order
    total: int | None
    records: int  # records of this job on this commit (reruns are new check runs)


@dataclass(frozen=True)
class GridRow:
    repository: str
    head_sha: str
    number: int | None  # a pull request number, when the commit came from one
    last_seen: datetime  # the latest change we received or result another relay posted
    cells: dict[str, Cell]
    downstream: dict[str, DownstreamCell] = field(default_factory=dict)


@dataclass(frozen=True)
class Grid:
    backends: list[str]  # our own backends' columns
    rows: list[GridRow]
    pager: Pager
    downstream: list[str] = field(default_factory=list)  # other relays' columns, after ours
    upgrades: list[UpgradeRow] = field(default_factory=list)  # newest release upgrade jobs

    @property
    def upgrade_backends(self) -> list[str]:
        return sorted({b for row in self.upgrades for b in row.cells})


@dataclass(frozen=True)
class UpgradeRow:
    """A release upgrade job on the grid: its range and, per backend, how A and B compare."""

    id: int
    repository: str
    base_sha: str
    head_sha: str
    state: str
    need_run: int | None
    tests_at_head: int | None
    created_at: datetime
    cells: dict[str, dict[str, int]] = field(default_factory=dict)  # backend -> category counts


@dataclass(frozen=True)
class ComparisonRow:
    """One test variant at A and at B."""

    test: str
    category: str  # newly failing | newly passing | still failing | not run | passing
    base: str | None  # outcome at A (None: not run there)
    head: str | None
    change: str | None  # why the upgrade ran it (added, renamed, body, dependencies)


@dataclass(frozen=True)
class BackendComparison:
    backend: str
    base_run: int | None
    head_run: int | None
    finished: bool
    counts: dict[str, int]
    rows: list[ComparisonRow]


@dataclass(frozen=True)
class UpgradePage:
    id: int
    repository: str
    base_sha: str
    head_sha: str
    state: str
    error: str | None
    created_at: datetime
    commits: int | None
    need_run: int | None
    tests_at_head: int | None
    by_kind: dict[str, int]
    spec_edits: int
    needs_person: list[str]
    has_patch: bool
    backends: list[BackendComparison]


@dataclass(frozen=True)
class ChangeInfo:
    """One delivery's view of a commit: the PR synchronize, the push, the rerun request."""

    id: int
    repository: str
    kind: str
    number: int | None
    ref: str | None
    base_sha: str | None
    head_sha: str
    event: str
    action: str | None
    delivery_id: str
    received_at: datetime
    title: str | None
    # backends the policy did not run for it, with why ({"backend", "reason"})
    skipped: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class ShardInfo:
    run_id: int
    index: int
    state: str
    exit_code: int | None
    attempts: int
    tests: int
    started_at: datetime | None
    finished_at: datetime | None
    log_tail: str | None
    runtime: str | None = None  # container | sandbox | local (not isolated)
    error: str | None = None  # why the shard itself failed (no runtime, no checkout, ...)
    estimated_seconds: float | None = None  # what the plan expected (learned durations)
    results: int = 0  # stored so far: a running shard streams them as its tests finish
    cpu_only: int = 0  # hardware-generic tests a spec listed: they ran on the CPU, not the card
    coverage_note: str | None = None  # its coverage recording: kept, or refused and why

    @property
    def actual_seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return max(0.0, (self.finished_at - self.started_at).total_seconds())


@dataclass(frozen=True)
class Failure:
    """A test that broke a run, or passed only on its rerun (flaky)."""

    result_id: int
    run_id: int
    shard_index: int
    nodeid: str
    outcome: str
    mode: str | None
    duration: float
    message: str | None
    details: str | None  # the full failure text; when long, its head and tail around a mark
    details_length: int  # characters stored (0: none)
    details_cut: bool  # the page shows an excerpt; the whole text is one link away
    log_excerpt: list[str]  # the shard log lines naming this test

    @property
    def flaky(self) -> bool:
        return self.outcome == "flaky"


_CURSOR = re.compile(FAILURES_CURSOR)  # the same pattern the API documents


@dataclass(frozen=True)
class FailureCursor:
    """Where a page of a run's failures ends: they are ordered flaky last, then by result
    id, so the last one shown names the next page (stable while results keep arriving)."""

    flaky: int  # 0 or 1
    result_id: int

    @property
    def token(self) -> str:
        return f"{self.flaky}-{self.result_id}"

    @classmethod
    def parse(cls, token: str) -> FailureCursor:
        """The cursor a page printed; ValueError for anything else."""
        match = _CURSOR.match(token)
        if match is None:
            raise ValueError(f"not a failures cursor: {token[:40]!r} (expected e.g. 0-1234)")
        return cls(int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True)
class ReportInfo:
    """One outgoing report of a run (an outbox row): where it goes and how sending went."""

    id: int
    target: str
    event: str | None
    state: str
    attempts: int
    next_attempt_at: datetime | None  # pending: the next try; sending: the sender's lease end
    last_error: str | None
    created_at: datetime
    sent_at: datetime | None


@dataclass(frozen=True)
class RunInfo:
    id: int
    change_id: int
    repository: str
    head_sha: str
    number: int | None
    backend: str
    attempt: int
    level: str
    state: str
    conclusion: str | None
    status: str
    counts: dict[str, int]  # in reading order, zeros dropped
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    shards: list[ShardInfo] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    failures_total: int = 0
    failures_after: str | None = None  # the cursor this page of failures starts after
    failures_next: str | None = None  # the cursor of the next page; None: this is the last
    triage: list[dict[str, Any]] = field(default_factory=list)  # the run's verdict, once made
    triage_state: str | None = None  # pending | running | done | failed; None: not triaged
    triage_tests: list[dict[str, Any]] = field(default_factory=list)  # a verdict per test
    triage_seconds: float = 0.0  # device time its checks took
    rerun_of: int | None = None  # queued again by hand: the run it recovers
    rerun_scope: str | None = None  # "all" (its plan) or "failed" (its failed shards)

    @property
    def recoverable(self) -> bool:
        """Whether it may be queued again (``POST /api/runs/{id}/rerun``)."""
        return recoverable(self.state, self.conclusion)


@dataclass(frozen=True)
class HeadDetail:
    """Everything the relay did for one upstream commit."""

    repository: str
    head_sha: str
    changes: list[ChangeInfo]
    runs: list[RunInfo]


@dataclass(frozen=True)
class CommitPage:
    sha: str
    heads: list[HeadDetail]
    downstream: list[DownstreamCell] = field(default_factory=list)  # other relays' results


@dataclass(frozen=True)
class DownstreamFailure:
    name: str
    file: str | None
    outcome: str | None
    message: str | None
    stacktrace: str | None


@dataclass(frozen=True)
class DownstreamRecord:
    """One result another relay posted (``POST /api/crcr/results``), as stored and shown."""

    cell: DownstreamCell
    key: str  # HUD's: verified_repo/delivery_id/workflow.name/job_name/check_run_id
    level: str | None
    event_type: str
    delivery_id: str
    check_run_id: str
    upstream_repo: str | None
    head_sha: str | None
    run_attempt: int | None
    url: str | None  # only http(s) links from the body are kept: it is untrusted
    artifact_url: str | None
    started_at: str | None
    completed_at: str | None
    queue_time: float | None
    execution_time: float | None
    received_at: datetime
    updated_at: datetime
    failed_tests: list[DownstreamFailure]
    failed_tests_omitted: int
    triage: dict[str, Any] | None


@dataclass(frozen=True)
class PullRequestPage:
    number: int
    repository: str | None
    title: str | None
    heads: list[HeadDetail]  # newest first


@dataclass(frozen=True)
class RunPage:
    run: RunInfo
    changes: list[ChangeInfo]
    selection: SelectionView | None
    reports: list[ReportInfo] = field(default_factory=list)  # oldest first


@dataclass(frozen=True)
class HistoryEntry:
    result_id: int
    run_id: int
    backend: str
    repository: str
    head_sha: str
    number: int | None
    outcome: str
    mode: str | None
    duration: float
    message: str | None
    at: datetime


@dataclass(frozen=True)
class SuggestionView:
    backend: str
    action: str  # xfail, tag, skip
    reason: str
    runs: int


@dataclass(frozen=True)
class TestHistory:
    __test__ = False

    nodeid: str
    total: int
    passed: int
    failed: int  # outcomes that broke a run
    flaky: int
    skipped: int
    mean_duration: float
    max_duration: float
    entries: list[HistoryEntry]
    pager: Pager
    durations: list[tuple[int, float, str]]  # (run id, seconds, outcome), oldest first
    # proposed spec edits from the last days' results (ci-relay specs suggest), per backend
    suggestions: list[SuggestionView] = field(default_factory=list)

    @property
    def flake_rate(self) -> float:
        return self.flaky / self.total if self.total else 0.0

    @property
    def failure_rate(self) -> float:
        return self.failed / self.total if self.total else 0.0


@dataclass(frozen=True)
class TrendPoint:
    run_id: int
    backend: str
    head_sha: str
    created_at: datetime
    conclusion: str | None
    pass_rate: float | None
    selected: int | None
    universe: int | None
    time_to_signal: float | None  # seconds from webhook received to the first stored result


@dataclass(frozen=True)
class Trends:
    backend: str | None
    backends: list[str]
    points: list[TrendPoint]  # oldest first

    @property
    def mean_pass_rate(self) -> float | None:
        rates = [p.pass_rate for p in self.points if p.pass_rate is not None]
        return sum(rates) / len(rates) if rates else None

    @property
    def mean_selected_share(self) -> float | None:
        shares = [
            p.selected / p.universe for p in self.points if p.selected is not None and p.universe
        ]
        return sum(shares) / len(shares) if shares else None

    @property
    def median_time_to_signal(self) -> float | None:
        times = sorted(p.time_to_signal for p in self.points if p.time_to_signal is not None)
        return times[len(times) // 2] if times else None


@functools.cache
def _json_names(cls: type) -> tuple[str, ...]:
    """A view class's fields, then its properties (derived values the JSON also carries)."""
    fields = tuple(f.name for f in dataclasses.fields(cls))
    properties = tuple(n for n in dir(cls) if isinstance(getattr(cls, n, None), property))
    return fields + properties


def to_json(view: Any) -> Any:
    """A view as JSON-ready data: dataclasses to dicts (with their properties), datetimes ISO."""
    if dataclasses.is_dataclass(view) and not isinstance(view, type):
        return {name: to_json(getattr(view, name)) for name in _json_names(type(view))}
    if isinstance(view, dict):
        return {str(k): to_json(v) for k, v in view.items()}
    if isinstance(view, list | tuple):
        return [to_json(v) for v in view]
    if isinstance(view, datetime):
        return view.isoformat()
    return view


@dataclass(frozen=True)
class HealthFigure:
    """One of CRCR's L3 figures for a backend over one window, beside its threshold."""

    key: str
    name: str
    unit: str  # seconds | ratio | days
    value: float | None  # None: no run in the window measured it
    threshold: float
    lower_is_better: bool
    met: bool | None
    window_days: int = 14


@dataclass(frozen=True)
class BackendHealth:
    backend: str
    runs: int  # finished pull-request runs in the promotion window (latest attempts)
    figures: list[HealthFigure]  # the promotion figures
    ready: bool  # every promotion figure measured and met: the numbers CRCR asks for
    level: str = "L2"  # the level of the backend's newest run
    # ready | not ready (at L2), within targets | temporarily demoted (at L3), demoted
    state: str = "not ready"
    reasons: list[str] = field(default_factory=list)  # why the state is what it is
    demotion_figures: list[HealthFigure] = field(default_factory=list)  # the fixed 7 days
    demotion_runs: int = 0


@dataclass(frozen=True)
class HealthRun:
    """A run behind one of a backend's L3 figures: its change, what it measured, its verdict."""

    run_id: int
    repository: str
    number: int | None  # the pull request
    head_sha: str
    state: str
    conclusion: str | None
    created_at: datetime
    value: float | None  # what the run contributes to the figure (seconds), if it is a time
    why: str  # why it is listed
    triage: str | None  # the triage verdict's category, "triaging", or None


@dataclass(frozen=True)
class HealthRuns:
    """The runs behind one figure of one backend (``/health/{backend}``): only those that
    count against it, then the runs still unfinished and those overdue."""

    backend: str
    figure: str  # a figure's key, or "" for the unfinished and overdue runs only
    name: str
    window_days: int
    since: datetime
    runs: list[HealthRun]
    unfinished: list[HealthRun]
    overdue: int  # of the unfinished, those past the figures' limits (queue or end to end)


@dataclass(frozen=True)
class Health:
    window_days: int
    since: datetime
    backends: list[BackendHealth]
