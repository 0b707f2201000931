"""L3 readiness as PyTorch's Cross-Repository CI Relay (CRCR) judges it now, per backend.

The facts, from public sources (no code copied):

- What counts (pytorch/test-infra, ``crcr_l3_summary`` query): the completed jobs of pull
  requests that started in the window, only the latest attempt of each; cancelled jobs stay in
  the denominator. Here a job is a run of a pull-request change; a run that was queued again
  (``runs.rerun_of``) gives way to its newer attempt. Release-upgrade runs are left out.
- Job success rate, not the share of tests that pass (pytorch/rfcs #102): successes / jobs,
  promoted at >= 90 %.
- Overrun rate (test-infra #8754, merged 2026-09-09, replacing "longest execution < 3 h", which
  one slow job anywhere in the window failed): jobs that ran longer than 3 h without timing
  out / jobs that did not time out; < 1 %.
- Timeout rate: timed-out jobs / jobs; < 1 %. Average queue time (dispatch to start) < 30 min.
- End-to-end P50 (test-infra #8635): one sample per run, from the dispatch to the run's end
  (queue included); < 3 h.
- Time at L2 >= 30 days before promotion.
- Windows are fixed (test-infra #8693's readiness panel): promotion over 14 days; demotion
  over 7 days on three of the figures (success rate, timeout rate, end-to-end P50), its
  thresholds the strict complement of the promotion ones (no hysteresis band). A backend at L3
  that fails one, or ran no pull-request job in those 7 days, is *temporarily demoted*: CRCR
  opens a pull request moving it to L2 (and stops creating new check runs meanwhile), closes it
  when the backend is back within its targets, and the backend is *demoted* when a maintainer
  merges it. Here that last step shows as a backend whose newest run is at L2 after an L3 run
  in the promotion window.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select
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
DEMOTION_DAYS = 7
OVERRUN_AFTER = 3 * HOUR


@dataclass(frozen=True)
class Criterion:
    key: str
    name: str
    unit: str  # seconds | ratio | days
    threshold: float
    lower_is_better: bool  # met below the threshold; else at or above it
    demotion: bool  # also judged over the demotion window


CRITERIA: tuple[Criterion, ...] = (
    Criterion("pass_rate", "job success rate", "ratio", 0.90, False, True),
    Criterion("timeout_rate", "timeout rate", "ratio", 0.01, True, True),
    Criterion("end_to_end_p50", "end-to-end P50 per run", "seconds", 3 * HOUR, True, True),
    Criterion("overrun_rate", "overrun rate (over 3 h, not timed out)", "ratio", 0.01, True, False),
    Criterion("queue_time_avg", "average queue time", "seconds", 30 * 60.0, True, False),
    Criterion("time_at_l2", "time at L2 or above", "days", 30.0, False, False),
)
# what a run that timed out leaves behind (see ci_relay.execution.crashes.why_it_died)
TIMEOUT_WORDS = ("%timeout%", "%wall-clock limit%")
AT_L3 = ("L3", "L4")
STATES = ("ready", "not ready", "within targets", "temporarily demoted", "demoted")


def health(session: Session, window_days: int, now: datetime | None = None) -> Health:
    """Each backend's promotion figures over the last ``window_days`` (14 by default, as
    CRCR's), its demotion figures over the fixed 7 days, and its state."""
    now = now or utcnow()
    since = now - timedelta(days=window_days)
    demotion_since = now - timedelta(days=DEMOTION_DAYS)
    runs = _pull_request_runs(session, min(since, demotion_since))
    timed_out = _timed_out(session, [r.id for r in runs])
    levels, first_l2 = _levels(session)
    by_backend: dict[str, list[Any]] = {}
    for r in runs:
        by_backend.setdefault(r.backend, []).append(r)
    backends = []
    for backend in sorted(set(by_backend) | set(levels)):
        mine = by_backend.get(backend, [])
        window = [r for r in mine if _after(r.finished_at, since)]
        recent = [r for r in mine if _after(r.finished_at, demotion_since)]
        tenure = _seconds_between(first_l2.get(backend), now)
        promotion = _figures(window, timed_out, tenure, window_days, demotion=False)
        demotion = _figures(recent, timed_out, tenure, DEMOTION_DAYS, demotion=True)
        level = levels.get(backend, "L2")
        was_l3 = any(r.level in AT_L3 for r in window)
        state, reasons = _state(level, was_l3, promotion, demotion, len(recent))
        backends.append(
            BackendHealth(
                backend=backend,
                runs=len(window),
                figures=promotion,
                ready=all(f.met for f in promotion),
                level=level,
                state=state,
                reasons=reasons,
                demotion_figures=demotion,
                demotion_runs=len(recent),
            )
        )
    return Health(window_days=window_days, since=since, backends=backends)


def _after(when: datetime | None, since: datetime) -> bool:
    """``when >= since``; SQLite hands datetimes back naive (UTC)."""
    if when is None:
        return False
    if when.tzinfo is None and since.tzinfo is not None:
        since = since.astimezone(UTC).replace(tzinfo=None)
    return when >= since


def _pull_request_runs(session: Session, since: datetime, backend: str | None = None) -> list[Any]:
    """Finished runs of pull-request changes since ``since`` (of one backend, if named),
    latest attempts only."""
    query = (
        select(
            Run.id,
            Run.backend,
            Run.level,
            Run.conclusion,
            Run.created_at,
            Run.started_at,
            Run.finished_at,
            Run.rerun_of,
            Delivery.received_at,
        )
        .join(Change, Run.change_id == Change.id)
        .join(Delivery, Change.delivery_pk == Delivery.id)
        .where(
            Run.state.in_((RunState.COMPLETED, RunState.FAILED)),
            Run.finished_at >= since,
            or_(
                Change.kind == "pull_request",
                and_(Change.kind == "rerun", Change.number.is_not(None)),
            ),
        )
        .order_by(Run.id)
    )
    if backend is not None:
        query = query.where(Run.backend == backend)
    rows = session.execute(query).all()
    superseded = {r.rerun_of for r in rows if r.rerun_of is not None}
    return [r for r in rows if r.id not in superseded]


def _timed_out(session: Session, ids: list[int]) -> set[int]:
    if not ids:
        return set()
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
    return set(session.scalars(crashed.union(shard_limit)))


def _levels(session: Session) -> tuple[dict[str, str], dict[str, datetime]]:
    """Each backend's level (its newest run's) and when it first ran at L2 or above."""
    newest = select(Run.backend, func.max(Run.id).label("id")).group_by(Run.backend).subquery()
    levels = dict(
        session.execute(select(Run.backend, Run.level).join(newest, Run.id == newest.c.id)).all()
    )
    first = dict(
        session.execute(
            select(Run.backend, func.min(Run.created_at))
            .where(Run.level.in_(("L2", *AT_L3)))
            .group_by(Run.backend)
        ).all()
    )
    return levels, first


def _figures(
    runs: Sequence[Any], timed_out: set[int], tenure: float | None, days: int, demotion: bool
) -> list[HealthFigure]:
    values = _values(runs, timed_out, tenure)
    return [
        HealthFigure(
            key=c.key,
            name=c.name,
            unit=c.unit,
            value=values[c.key],
            threshold=c.threshold,
            lower_is_better=c.lower_is_better,
            met=_met(values[c.key], c.threshold, c.lower_is_better),
            window_days=days,
        )
        for c in CRITERIA
        if c.demotion or not demotion
    ]


def _values(
    runs: Sequence[Any], timed_out: set[int], tenure: float | None
) -> dict[str, float | None]:
    queue = [q for r in runs if (q := _seconds_between(r.created_at, r.started_at)) is not None]
    execution = {r.id: _seconds_between(r.started_at, r.finished_at) for r in runs}
    end_to_end = [
        e for r in runs if (e := _seconds_between(r.received_at, r.finished_at)) is not None
    ]
    finished = [r for r in runs if r.id not in timed_out]
    overran = [r for r in finished if (execution[r.id] or 0.0) > OVERRUN_AFTER]
    return {
        "pass_rate": sum(r.conclusion == "success" for r in runs) / len(runs) if runs else None,
        "timeout_rate": sum(r.id in timed_out for r in runs) / len(runs) if runs else None,
        "end_to_end_p50": statistics.median(end_to_end) if end_to_end else None,
        "overrun_rate": len(overran) / len(finished) if finished else None,
        "queue_time_avg": statistics.fmean(queue) if queue else None,
        "time_at_l2": None if tenure is None else tenure / 86400.0,
    }


def _met(value: float | None, limit: float, lower_is_better: bool) -> bool | None:
    if value is None:
        return None
    return value < limit if lower_is_better else value >= limit


def _state(
    level: str,
    was_l3: bool,
    promotion: list[HealthFigure],
    demotion: list[HealthFigure],
    recent_runs: int,
) -> tuple[str, list[str]]:
    """The backend's readiness state and why."""
    if level in AT_L3:
        if not recent_runs:
            return "temporarily demoted", [f"no pull-request run in the last {DEMOTION_DAYS} days"]
        failing = [_miss(f) for f in demotion if f.met is False]
        if failing:
            return "temporarily demoted", failing
        return "within targets", []
    if was_l3:
        return "demoted", ["the newest run is at L2 after runs at L3 in the window"]
    missing = [_miss(f) for f in promotion if not f.met]
    return ("not ready", missing) if missing else ("ready", [])


def _miss(figure: HealthFigure) -> str:
    if figure.value is None:
        return f"{figure.name}: no data in {figure.window_days} days"
    bar = "<" if figure.lower_is_better else ">="
    return (
        f"{figure.name}: {_shown(figure.value, figure.unit)} over {figure.window_days} days "
        f"(needs {bar} {_shown(figure.threshold, figure.unit)})"
    )


def _shown(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.1%}"
    if unit == "days":
        return f"{value:.1f} days"
    return f"{value / 60:.0f} min" if value < 2 * HOUR else f"{value / HOUR:.1f} h"
