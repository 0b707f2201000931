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
)


def delivery_id_of(rt: RelayContext, task: str, pk: int) -> str | None:
    """The GitHub/CRCR delivery id a task's row descends from (for log context)."""
    with rt.db.session() as session:
        if task == "process":
            query = select(Delivery.delivery_id).where(Delivery.id == pk)
        elif task == "report":
            query = (
                select(Delivery.delivery_id)
                .join(Change, Change.delivery_pk == Delivery.id)
                .join(Run, Run.change_id == Change.id)
                .join(OutboxMessage, OutboxMessage.run_id == Run.id)
                .where(OutboxMessage.id == pk)
            )
        elif task == "execute":
            query = (
                select(Delivery.delivery_id)
                .join(Change, Change.delivery_pk == Delivery.id)
                .join(Run, Run.change_id == Change.id)
                .join(Shard, Shard.run_id == Run.id)
                .where(Shard.id == pk)
            )
        else:
            query = (
                select(Delivery.delivery_id)
                .join(Change, Change.delivery_pk == Delivery.id)
                .join(Run, Run.change_id == Change.id)
                .where(Run.id == pk)
            )
        return session.scalar(query)
