"""L3 readiness: CRCR's promotion figures per backend over a window, each beside its threshold.

CRCR promotes a downstream from L2 (results on HUD) to L3 (a check on labelled PRs) when, over
recent runs, the average queue time is under 30 min, the longest execution under 3 h, the
end-to-end P50 under 3 h, the timeout rate under 1 % and the job pass rate over 90 %. Two
queries whatever the window holds: the runs, and which of them timed out.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ci_relay.dashboard.queries.common import _seconds_between
from ci_relay.dashboard.views import BackendHealth, Health, HealthFigure
from ci_relay.store.models import (
    Change,
    Delivery,
    Run,
    RunState,
    Shard,
    TestResult,
    utcnow,
)

HOUR = 3600.0
# (key, what it is, unit, threshold, whether lower is better): CRCR's L3 bar
THRESHOLDS: tuple[tuple[str, str, str, float, bool], ...] = (
    ("queue_time_avg", "average queue time", "seconds", 30 * 60.0, True),
    ("execution_max", "longest execution", "seconds", 3 * HOUR, True),
    ("end_to_end_p50", "end-to-end P50", "seconds", 3 * HOUR, True),
    ("timeout_rate", "timeout rate", "ratio", 0.01, True),
    ("pass_rate", "job pass rate", "ratio", 0.90, False),
)
# what a run that timed out leaves behind (see ci_relay.execution.crashes.why_it_died)
TIMEOUT_WORDS = ("%timeout%", "%wall-clock limit%")


def health(session: Session, window_days: int, now: datetime | None = None) -> Health:
    """Each backend's promotion figures over the finished runs of the last ``window_days``
    (release-upgrade runs left out: they test a range for the spec maintainers, not PRs)."""
    now = now or utcnow()
    since = now - timedelta(days=window_days)
    rows = session.execute(
        select(
            Run.id,
            Run.backend,
            Run.conclusion,
            Run.created_at,
            Run.started_at,
            Run.finished_at,
            Delivery.received_at,
        )
        .join(Change, Run.change_id == Change.id)
        .join(Delivery, Change.delivery_pk == Delivery.id)
        .where(
            Run.state.in_((RunState.COMPLETED, RunState.FAILED)),
            Run.finished_at >= since,
            Change.kind != "upgrade",
        )
        .order_by(Run.id)
    ).all()
    ids = [r.id for r in rows]
    timed_out: set[int] = set()
    if ids:
        crashed = (
            select(Shard.run_id)
            .join(TestResult, TestResult.shard_id == Shard.id)
            .where(
                Shard.run_id.in_(ids),
                TestResult.outcome == "crashed",
                or_(*(TestResult.message.like(w) for w in TIMEOUT_WORDS)),
            )
        )
        shard_limit = select(Shard.run_id).where(
            Shard.run_id.in_(ids), or_(*(Shard.error.like(w) for w in TIMEOUT_WORDS))
        )
        timed_out = set(session.scalars(crashed.union(shard_limit)))
    by_backend: dict[str, list[Any]] = {}
    for r in rows:
        by_backend.setdefault(r.backend, []).append(r)
    backends = []
    for backend, runs in sorted(by_backend.items()):
        queue = [q for r in runs if (q := _seconds_between(r.created_at, r.started_at)) is not None]
        execution = [
            e for r in runs if (e := _seconds_between(r.started_at, r.finished_at)) is not None
        ]
        end_to_end = [
            e for r in runs if (e := _seconds_between(r.received_at, r.finished_at)) is not None
        ]
        values: dict[str, float | None] = {
            "queue_time_avg": statistics.fmean(queue) if queue else None,
            "execution_max": max(execution) if execution else None,
            "end_to_end_p50": statistics.median(end_to_end) if end_to_end else None,
            "timeout_rate": sum(r.id in timed_out for r in runs) / len(runs),
            "pass_rate": sum(r.conclusion == "success" for r in runs) / len(runs),
        }
        figures = [
            HealthFigure(
                key=key,
                name=name,
                unit=unit,
                value=values[key],
                threshold=limit,
                lower_is_better=lower,
                met=_met(values[key], limit, lower),
            )
            for key, name, unit, limit, lower in THRESHOLDS
        ]
        backends.append(
            BackendHealth(
                backend=backend,
                runs=len(runs),
                figures=figures,
                ready=all(f.met for f in figures),
            )
        )
    return Health(window_days=window_days, since=since, backends=backends)


def _met(value: float | None, limit: float, lower_is_better: bool) -> bool | None:
    if value is None:
        return None
    return value < limit if lower_is_better else value > limit
