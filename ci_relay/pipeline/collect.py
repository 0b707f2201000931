"""Step 4: a run whose shards all finished is closed and its reports are queued (then its
triage, when a test broke)."""

from __future__ import annotations

from sqlalchemy import update

from ci_relay.context import RelayContext
from ci_relay.pipeline.triage import wants_triage
from ci_relay.reporting.outbox import enqueue_reports
from ci_relay.steps import Next, claim_rows, report_steps
from ci_relay.store.models import (
    Run,
    RunState,
    ShardState,
    Triage,
    TriageState,
    utcnow,
)


def collect(rt: RelayContext, run_id: int) -> list[Next]:
    """Close a run once every shard finished; queue its report in the outbox."""
    with rt.db.session() as session:
        run = session.get(Run, run_id)
        if run is None or run.state != RunState.RUNNING:
            return []
        if any(s.state in (ShardState.PENDING, ShardState.RUNNING) for s in run.shards):
            return []
        counts: dict[str, int] = {}
        for shard in run.shards:
            for result in shard.results:
                counts[result.outcome] = counts.get(result.outcome, 0) + 1
        codes = {s.exit_code for s in run.shards}
        if any(s.state == ShardState.FAILED for s in run.shards):
            conclusion = "error"
        elif 1 in codes:
            conclusion = "failure"
        else:
            conclusion = "success"
        claimed = claim_rows(
            session,
            update(Run)
            .where(Run.id == run_id, Run.state == RunState.RUNNING)
            .values(
                state=RunState.COMPLETED,
                conclusion=conclusion,
                counts=counts,
                finished_at=utcnow(),
                updated_at=utcnow(),
            ),
        )
        if not claimed:
            return []
        session.refresh(run)
        steps = report_steps(enqueue_reports(session, rt, run, "completed"))
        if wants_triage(rt, run):  # after the report: the verdict follows as an update
            triage = Triage(run_id=run.id, state=TriageState.PENDING)
            session.add(triage)
            session.flush()
            steps.append(Next("triage", triage.id, run.backend))
        return steps
    return []
