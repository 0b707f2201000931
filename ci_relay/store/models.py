"""SQLAlchemy models. The database, not the queue, is the source of truth.

State columns are plain strings (portable across SQLite and PostgreSQL); their
values are the ``*State`` constants below.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class DeliveryState:
    RECEIVED = "received"  # stored, waiting for a worker
    PROCESSED = "processed"  # turned into a change (and runs, as policy says)
    IGNORED = "ignored"  # valid but nothing to do (event, repository, policy)
    FAILED = "failed"  # processing raised; kept for replay


class RunState:
    PENDING = "pending"
    SELECTING = "selecting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


# a finished run that ended so is not queued again by hand (there is nothing to recover)
PASSED_CONCLUSIONS = ("success", "neutral", "skipped")


def recoverable(state: str, conclusion: str | None) -> bool:
    """Whether a run may be queued again by hand: it finished and did not pass."""
    return state == RunState.FAILED or (
        state == RunState.COMPLETED and conclusion not in PASSED_CONCLUSIONS
    )


class ShardState:
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Delivery(Base):
    """One webhook or dispatch as received, raw body first, before any processing."""

    __tablename__ = "deliveries"
    __table_args__ = (
        UniqueConstraint("hook_id", "delivery_id", name="uq_delivery_hook"),
        Index("ix_deliveries_state", "state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    source: Mapped[str] = mapped_column(String(16))  # github | dispatch | replay
    hook_id: Mapped[str] = mapped_column(String(64))
    delivery_id: Mapped[str] = mapped_column(String(128))
    event: Mapped[str] = mapped_column(String(64))
    action: Mapped[str | None] = mapped_column(String(64))
    repository: Mapped[str | None] = mapped_column(String(256))
    head_sha: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default=DeliveryState.RECEIVED)
    reason: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    headers: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    body: Mapped[bytes] = mapped_column(LargeBinary)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    processed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    change: Mapped[Change | None] = relationship(back_populates="delivery")


class AuditRecord(Base):
    """Rejected requests of one kind in one window (:mod:`ci_relay.audit`): what was wrong,
    how often, never the body."""

    __tablename__ = "audit_records"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    path: Mapped[str] = mapped_column(String(128))
    status: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    remote: Mapped[str | None] = mapped_column(String(128))
    event: Mapped[str | None] = mapped_column(String(64))
    delivery_id: Mapped[str | None] = mapped_column(String(128))
    count: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    last_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Change(Base):
    """An upstream change a delivery describes: a PR head, a push, a rerun request."""

    __tablename__ = "changes"
    __table_args__ = (
        Index("ix_changes_repo_head", "repository", "head_sha"),
        Index("ix_changes_head", "head_sha"),  # the dashboard's commit page (sha prefixes)
        Index("ix_changes_repo_number", "repository", "number"),  # its PR page
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    delivery_pk: Mapped[int] = mapped_column(ForeignKey("deliveries.id"), unique=True)
    repository: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(32))  # pull_request | push | rerun | nightly | upgrade
    number: Mapped[int | None] = mapped_column(Integer)
    ref: Mapped[str | None] = mapped_column(String(256))
    base_sha: Mapped[str | None] = mapped_column(String(64))
    head_sha: Mapped[str] = mapped_column(String(64))
    labels: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # the backends the policy did not run for this change, and why: [{"backend", "reason"}]
    skipped: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    delivery: Mapped[Delivery] = relationship(back_populates="change")
    runs: Mapped[list[Run]] = relationship(back_populates="change", order_by="Run.id")


class Run(Base):
    """One backend's test run for a change; a rerun request adds an attempt."""

    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("change_id", "backend", "attempt", name="uq_run_attempt"),
        Index("ix_runs_state", "state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    change_id: Mapped[int] = mapped_column(ForeignKey("changes.id"))
    backend: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    level: Mapped[str] = mapped_column(String(4))
    state: Mapped[str] = mapped_column(String(16), default=RunState.PENDING)
    conclusion: Mapped[str | None] = mapped_column(String(16))
    counts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # why the run could not be tested at all (selection impossible); shards keep their own
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # queued again by hand: the run it recovers, and what of it runs again ("all": its
    # plan; "failed": its failed shards), without selecting anew
    rerun_of: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    rerun_scope: Mapped[str | None] = mapped_column(String(8))

    change: Mapped[Change] = relationship(back_populates="runs")
    selection: Mapped[Selection | None] = relationship(back_populates="run")
    shards: Mapped[list[Shard]] = relationship(back_populates="run", order_by="Shard.index")


class Selection(Base):
    """Which tests a run covers and why (the selector's stored output)."""

    __tablename__ = "selections"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), unique=True)
    strategy: Mapped[str] = mapped_column(String(32))
    plan: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run] = relationship(back_populates="selection")


class Shard(Base):
    """A slice of a run's tests executed by one worker process."""

    __tablename__ = "shards"
    __table_args__ = (UniqueConstraint("run_id", "index", name="uq_shard_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    index: Mapped[int] = mapped_column(Integer)
    test_files: Mapped[list[Any]] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(16), default=ShardState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    log_tail: Mapped[str | None] = mapped_column(Text)
    # where it ran: container | sandbox | local (not isolated; only when a person chose it)
    runtime: Mapped[str | None] = mapped_column(String(16))
    # why the shard itself failed (no isolating runtime, no checkout, tests not startable)
    error: Mapped[str | None] = mapped_column(Text)
    # what became of its coverage recording: kept, or refused and why (None: not recorded)
    coverage_note: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    run: Mapped[Run] = relationship(back_populates="shards")
    results: Mapped[list[TestResult]] = relationship(back_populates="shard")


class TestResult(Base):
    """One test variant's outcome in one shard."""

    __test__ = False
    __tablename__ = "test_results"
    __table_args__ = (
        UniqueConstraint("shard_id", "nodeid", name="uq_result_node"),
        Index("ix_results_nodeid", "nodeid"),  # one test's history
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    shard_id: Mapped[int] = mapped_column(ForeignKey("shards.id"))
    nodeid: Mapped[str] = mapped_column(String(1024))
    outcome: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str | None] = mapped_column(String(32))
    duration: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str | None] = mapped_column(Text)  # one line, for lists
    # the whole failure text (pytest's longrepr, or a crash's reason and stack), <= 64 KB
    details: Mapped[str | None] = mapped_column(Text)
    # what the outcome does not say by itself: "ran on the CPU" for a hardware-generic test
    note: Mapped[str | None] = mapped_column(String(500))

    shard: Mapped[Shard] = relationship(back_populates="results")


class UpgradeState:
    PENDING = "pending"  # waiting for its plan (the test-level diff of A..B)
    PLANNING = "planning"
    RUNNING = "running"  # its runs at A and at B exist; the page compares as they finish
    FAILED = "failed"  # the plan could not be made (unknown commit, specs that do not load)


class Upgrade(Base):
    """A release upgrade job: the tests that changed between two upstream revisions, run
    at both on chosen backends (as two changes of kind ``upgrade``) and compared."""

    __tablename__ = "upgrades"
    __table_args__ = (Index("ix_upgrades_state", "state"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    repository: Mapped[str] = mapped_column(String(256))
    base_sha: Mapped[str] = mapped_column(String(64))
    head_sha: Mapped[str] = mapped_column(String(64))
    backends: Mapped[list[Any]] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(16), default=UpgradeState.PENDING)
    plan: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # UpgradePlan.to_json
    error: Mapped[str | None] = mapped_column(Text)
    base_change_id: Mapped[int | None] = mapped_column(ForeignKey("changes.id"))
    head_change_id: Mapped[int | None] = mapped_column(ForeignKey("changes.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )


class TriageState:
    PENDING = "pending"  # the run finished with failures; its checks have not started
    RUNNING = "running"
    DONE = "done"  # a verdict per triaged test and one for the run
    FAILED = "failed"  # triage itself broke: the run's verdict is ``unknown`` with the reason


class Triage(Base):
    """Whose fault a run's failures are: reruns at head, at the change's base and on cpu
    (and a bisection of a longer range) for at most N failing tests, and the verdicts."""

    __tablename__ = "triages"
    __table_args__ = (Index("ix_triages_state", "state"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), unique=True)
    state: Mapped[str] = mapped_column(String(16), default=TriageState.PENDING)
    # the run's verdict in the callback's format (TriageVerdict), empty until done
    verdict: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # one verdict per triaged test, with the checks behind it (ci_relay.triage.verdict)
    tests: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # device time the checks took (what triage costs beside the run)
    device_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    run: Mapped[Run] = relationship()


class OutboxState:
    PENDING = "pending"  # waiting for next_attempt_at (first try or a retry)
    SENDING = "sending"  # claimed by a sender until next_attempt_at (its lease)
    SENT = "sent"
    FAILED = "failed"  # the target refused it (4xx): our payload is wrong; not retried
    SUPERSEDED = "superseded"  # a newer report of the same run and target replaces it


class OutboxMessage(Base):
    """A report to send (CRCR callback, HUD, GitHub check), retried until delivered."""

    __tablename__ = "outbox"
    __table_args__ = (
        Index("ix_outbox_state", "state"),
        Index("ix_outbox_run_target", "run_id", "target"),
        Index("ix_outbox_target_key", "target", "key"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    target: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # what the limits of a target are counted by, e.g. GitHub's statuses per (sha, context)
    key: Mapped[str | None] = mapped_column(String(512))
    # what the target answered that later attempts or reports need (a check run id, progress)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class CrcrResult(Base):
    """A HUD-format result another downstream relay sent us, upserted on the HUD key."""

    __tablename__ = "crcr_results"
    __table_args__ = (
        UniqueConstraint(
            "verified_repo",
            "delivery_id",
            "workflow_name",
            "job_name",
            "check_run_id",
            name="uq_crcr_result_key",
        ),
        Index("ix_crcr_results_repo", "verified_repo", "updated_at"),
        Index("ix_crcr_results_head", "upstream_repo", "head_sha"),  # the dashboard's grid
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    verified_repo: Mapped[str] = mapped_column(String(256))
    delivery_id: Mapped[str] = mapped_column(String(128))
    workflow_name: Mapped[str] = mapped_column(String(256))
    job_name: Mapped[str] = mapped_column(String(256))
    check_run_id: Mapped[str] = mapped_column(String(64))
    level: Mapped[str | None] = mapped_column(String(16))
    event_type: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    conclusion: Mapped[str | None] = mapped_column(String(32))
    upstream_repo: Mapped[str | None] = mapped_column(String(256))
    head_sha: Mapped[str | None] = mapped_column(String(64))
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    body: Mapped[bytes] = mapped_column(LargeBinary)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CoverageRecord(Base):
    """One shard's per-test coverage map (``test_selection.coverage.map``, its gzip JSON):
    the functions each of its tests executed, recorded where the tests ran. The maps of a
    run's shards together are the map of that revision on that backend; the newest is what
    the relay's selection ranks with."""

    __tablename__ = "coverage_maps"
    __table_args__ = (Index("ix_coverage_maps_repo", "repository", "backend", "run_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    shard_id: Mapped[int] = mapped_column(ForeignKey("shards.id"), unique=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    repository: Mapped[str] = mapped_column(String(256))
    backend: Mapped[str] = mapped_column(String(32))
    revision: Mapped[str] = mapped_column(String(64))
    tests: Mapped[int] = mapped_column(Integer, default=0)
    functions: Mapped[int] = mapped_column(Integer, default=0)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
