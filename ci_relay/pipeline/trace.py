"""Which GitHub/CRCR delivery a task's row descends from, for log context."""

from __future__ import annotations

from sqlalchemy import select

from ci_relay.context import RelayContext
from ci_relay.store.models import (
    Change,
    Delivery,
    OutboxMessage,
    Run,
    Shard,
    Triage,
)


def delivery_id_of(rt: RelayContext, task: str, pk: int) -> str | None:
    """The GitHub/CRCR delivery id a task's row descends from (for log context)."""
    with rt.db.session() as session:
        if task == "process":
            return session.scalar(select(Delivery.delivery_id).where(Delivery.id == pk))
        if task == "upgrade":
            return f"upgrade-{pk}"
        of_run = (
            select(Delivery.delivery_id)
            .join(Change, Change.delivery_pk == Delivery.id)
            .join(Run, Run.change_id == Change.id)
        )
        if task == "report":
            query = of_run.join(OutboxMessage, OutboxMessage.run_id == Run.id).where(
                OutboxMessage.id == pk
            )
        elif task == "triage":
            query = of_run.join(Triage, Triage.run_id == Run.id).where(Triage.id == pk)
        elif task == "execute":
            query = of_run.join(Shard, Shard.run_id == Run.id).where(Shard.id == pk)
        else:  # select, collect: the row is the run
            query = of_run.where(Run.id == pk)
        return session.scalar(query)
