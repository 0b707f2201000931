"""Behind an L3 figure (issue 56, item 5): from a backend's figure on ``/health`` to the runs
that count against it, only those: the failed runs behind the success rate, the timed-out
ones behind the timeout rate, those over 3 h behind the overrun rate and the end-to-end P50,
those queued over 30 min behind the queue time; then every run still unfinished, the overdue
ones (queued past 30 min, or going past 3 h) first. Each with its change and its triage
verdict. The same counting as ``health``: pull-request runs, latest attempts."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ci_relay.dashboard.queries.common import _seconds_between
from ci_relay.dashboard.queries.grid import _category
from ci_relay.dashboard.queries.health import (
    CRITERIA,
    OVERRUN_AFTER,
    _pull_request_runs,
    _shown,
    _timed_out,
)
from ci_relay.dashboard.views import HealthRun, HealthRuns
from ci_relay.store.models import Change, Run, RunState, Triage, utcnow

QUEUE_LIMIT = 30 * 60.0
NAMES = {c.key: c.name for c in CRITERIA}
MAX_LISTED = 500


def health_runs(
    session: Session, backend: str, window_days: int, figure: str, now: datetime | None = None
) -> HealthRuns:
    """The runs of ``backend`` behind ``figure`` over the window, and its unfinished runs."""
    now = now or utcnow()
    since = now - timedelta(days=window_days)
    finished = _pull_request_runs(session, since, backend)
    timed_out = _timed_out(session, [r.id for r in finished])
    listed: list[tuple[Any, float | None, str]] = []
    for r in finished:
        found = _against(figure, r, r.id in timed_out)
        if found is not None:
            listed.append((r, *found))
    unfinished = session.execute(
        select(Run.id, Run.created_at, Run.started_at, Run.state)
        .join(Change, Run.change_id == Change.id)
        .where(
            Run.backend == backend,
            Run.state.in_((RunState.PENDING, RunState.SELECTING, RunState.RUNNING)),
            Change.kind.in_(("pull_request", "rerun")),
        )
        .order_by(Run.created_at)
        .limit(MAX_LISTED)
    ).all()
    going = []
    overdue = 0
    for r in unfinished:
        queued = _seconds_between(r.created_at, r.started_at or now) or 0.0
        running = _seconds_between(r.created_at, now) or 0.0
        late = (r.started_at is None and queued > QUEUE_LIMIT) or running > OVERRUN_AFTER
        overdue += late
        why = (
            f"overdue: queued {_shown(queued, 'seconds')} without starting"
            if r.started_at is None and queued > QUEUE_LIMIT
            else (f"overdue: going for {_shown(running, 'seconds')}" if late else f"{r.state}")
        )
        going.append((r.id, running, why, late))
    going.sort(key=lambda g: (not g[3], g[0]))
    details = _details(session, [r.id for r, _v, _w in listed] + [g[0] for g in going])
    return HealthRuns(
        backend=backend,
        figure=figure,
        name=NAMES.get(figure, "unfinished and overdue runs"),
        window_days=window_days,
        since=since,
        runs=[_row(details[r.id], value, why) for r, value, why in listed[-MAX_LISTED:]],
        unfinished=[_row(details[i], value, why) for i, value, why, _late in going],
        overdue=overdue,
    )


def _against(figure: str, r: Any, timed_out: bool) -> tuple[float | None, str] | None:
    """(the run's value, why it counts) when the run counts against ``figure``, else None."""
    execution = _seconds_between(r.started_at, r.finished_at)
    if figure == "pass_rate" and r.conclusion != "success":
        return None, f"ended {r.conclusion or 'without a conclusion'}"
    if figure == "timeout_rate" and timed_out:
        return execution, "a test or a shard hit its time limit"
    if figure == "overrun_rate" and not timed_out and (execution or 0.0) > OVERRUN_AFTER:
        return execution, f"ran {_shown(execution or 0.0, 'seconds')}, over 3 h"
    if figure == "end_to_end_p50":
        total = _seconds_between(r.received_at, r.finished_at)
        if total is not None and total >= OVERRUN_AFTER:
            return total, f"took {_shown(total, 'seconds')} from dispatch to end, 3 h or more"
    if figure == "queue_time_avg":
        queued = _seconds_between(r.created_at, r.started_at)
        if queued is not None and queued > QUEUE_LIMIT:
            return queued, f"queued {_shown(queued, 'seconds')}, over 30 min"
    return None


def _details(session: Session, ids: list[int]) -> dict[int, Any]:
    if not ids:
        return {}
    rows = session.execute(
        select(
            Run.id,
            Run.state,
            Run.conclusion,
            Run.created_at,
            Change.repository,
            Change.number,
            Change.head_sha,
            Triage.verdict,
            Triage.state.label("triage_state"),
        )
        .join(Change, Run.change_id == Change.id)
        .outerjoin(Triage, Triage.run_id == Run.id)
        .where(Run.id.in_(ids))
    ).all()
    return {r.id: r for r in rows}


def _row(r: Any, value: float | None, why: str) -> HealthRun:
    return HealthRun(
        run_id=r.id,
        repository=r.repository,
        number=r.number,
        head_sha=r.head_sha,
        state=r.state,
        conclusion=r.conclusion,
        created_at=r.created_at,
        value=value,
        why=why,
        triage=_category(r.verdict, r.triage_state),
    )
