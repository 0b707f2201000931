"""Work the database says is pending but that may have lost its message: enqueue it again."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import or_, select, update

from ci_relay.context import RelayContext
from ci_relay.reporting.outbox import due as due_reports
from ci_relay.steps import Next, report_steps
from ci_relay.store.models import (
    Delivery,
    DeliveryState,
    Run,
    RunState,
    Shard,
    ShardState,
    Triage,
    TriageState,
    Upgrade,
    UpgradeState,
    utcnow,
)


def reconcile(
    rt: RelayContext,
    older_than: timedelta,
    stale_after: timedelta,
    silent_after: timedelta | None = None,
) -> list[Next]:
    """Work the database says is pending but that may have no message: enqueue it again.
    ``stale_after``: a claimed selection or upgrade plan (no heartbeat) is given up on;
    ``silent_after`` (default the same): a running shard or triage whose worker's heartbeat
    has stopped (:func:`ci_relay.steps.keep_claimed`) is."""
    cutoff = utcnow() - older_than
    silent = stale_after if silent_after is None else silent_after
    out: list[Next] = []
    with rt.db.session() as session:
        for pk in session.scalars(
            select(Delivery.id).where(
                Delivery.state == DeliveryState.RECEIVED,
                or_(Delivery.enqueued_at.is_(None), Delivery.enqueued_at < cutoff),
            )
        ):
            out.append(Next("process", pk))
        for pk in session.scalars(
            select(Upgrade.id).where(
                or_(
                    (Upgrade.state == UpgradeState.PENDING) & (Upgrade.updated_at < cutoff),
                    (Upgrade.state == UpgradeState.PLANNING)
                    & (Upgrade.updated_at < utcnow() - stale_after),
                )
            )
        ):
            out.append(Next("upgrade", pk))
        for run_id in session.scalars(
            select(Run.id).where(
                or_(
                    (Run.state == RunState.PENDING) & (Run.updated_at < cutoff),
                    (Run.state == RunState.SELECTING) & (Run.updated_at < utcnow() - stale_after),
                )
            )
        ):
            out.append(Next("select", run_id))
        for shard in session.scalars(
            select(Shard).where(
                or_(
                    (Shard.state == ShardState.PENDING) & (Shard.updated_at < cutoff),
                    (Shard.state == ShardState.RUNNING) & (Shard.updated_at < utcnow() - silent),
                )
            )
        ):
            out.append(Next("execute", shard.id, shard.run.backend))
        for run in session.scalars(select(Run).where(Run.state == RunState.RUNNING)):
            if run.shards and all(
                s.state in (ShardState.DONE, ShardState.FAILED) for s in run.shards
            ):
                out.append(Next("collect", run.id))
        for triage in session.scalars(
            select(Triage).where(
                or_(
                    (Triage.state == TriageState.PENDING) & (Triage.updated_at < cutoff),
                    (Triage.state == TriageState.RUNNING) & (Triage.updated_at < utcnow() - silent),
                )
            )
        ):
            out.append(Next("triage", triage.id, triage.run.backend))
        out.extend(report_steps(due_reports(session, cutoff)))  # retries are due; or a lost send
        if out:
            session.execute(
                update(Delivery)
                .where(Delivery.id.in_([n.arg for n in out if n.task == "process"]))
                .values(enqueued_at=utcnow())
            )
    return out
