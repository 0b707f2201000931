"""The trends page: pass rate, share selected and time to signal over the newest runs."""

from __future__ import annotations

from sqlalchemy import (
    func,
    select,
)
from sqlalchemy.orm import Session

from ci_relay.dashboard.queries.common import _seconds_between
from ci_relay.dashboard.status import pass_rate
from ci_relay.dashboard.views import (
    TrendPoint,
    Trends,
)
from ci_relay.store.models import (
    Change,
    Delivery,
    Run,
    RunState,
    Selection,
    Shard,
)


def trends(session: Session, backend: str | None = None, limit: int = 200) -> Trends:
    """The last ``limit`` finished runs, oldest first: pass rate, selection size, time to signal.

    Time to signal is from the webhook's arrival to the first shard's stored results
    (results are written when a shard finishes). Selected tests are counted from the
    shards (small lists); only the suite size is read out of the stored plan.
    """
    backends = list(
        session.scalars(select(Run.backend).group_by(Run.backend).order_by(Run.backend))
    )
    query = (
        select(
            Run.id,
            Run.backend,
            Run.created_at,
            Run.conclusion,
            Run.counts,
            Change.head_sha,
            Delivery.received_at,
            Selection.plan["universe_size"].as_integer().label("universe"),
        )
        .join(Change, Run.change_id == Change.id)
        .join(Delivery, Change.delivery_pk == Delivery.id)
        .outerjoin(Selection, Selection.run_id == Run.id)
        .where(Run.state.in_((RunState.COMPLETED, RunState.FAILED)))
        .order_by(Run.id.desc())
        .limit(limit)
    )
    if backend:
        query = query.where(Run.backend == backend)
    rows = session.execute(query).all()
    shards = {
        r.run_id: r
        for r in session.execute(
            select(
                Shard.run_id,
                func.min(Shard.finished_at).label("first_result"),
                func.sum(func.json_array_length(Shard.test_files)).label("selected"),
            )
            .where(Shard.run_id.in_([r.id for r in rows]))
            .group_by(Shard.run_id)
        )
    }
    points = []
    for r in reversed(rows):
        shard = shards.get(r.id)
        selected = int(shard.selected or 0) if shard else (0 if r.universe is not None else None)
        points.append(
            TrendPoint(
                run_id=r.id,
                backend=r.backend,
                head_sha=r.head_sha,
                created_at=r.created_at,
                conclusion=r.conclusion,
                pass_rate=pass_rate(r.counts or {}),
                selected=selected,
                universe=r.universe,
                time_to_signal=_seconds_between(
                    r.received_at, shard.first_result if shard else None
                ),
            )
        )
    return Trends(backend=backend, backends=backends, points=points)
