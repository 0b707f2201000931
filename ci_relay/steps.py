"""The step protocol the pipeline, intake, replay and reporting share.

Intake and reporting must not import the pipeline (it imports them); what they need from it
lives here: the task a committed step hands on (``Next``, ``report_steps``), the
conditional-UPDATE claims (``claim_rows``, ``claim_pending_or_stale``, ``keep_claimed``) and
the upstream event a stored delivery carries (``delivery_event``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import CursorResult, or_, update
from sqlalchemy.orm import Session

from ci_relay.store.models import Delivery, utcnow

if TYPE_CHECKING:
    from ci_relay.context import RelayContext

log = logging.getLogger("ci_relay.steps")


@dataclass(frozen=True)
class Next:
    """A task to enqueue after the step's transaction committed."""

    task: str  # process | upgrade | select | execute | collect | report | triage
    arg: int
    backend: str | None = None


def claim_rows(session: Session, statement: Any) -> int:
    """Rows a conditional UPDATE changed: 1 means this worker claimed the row."""
    result = cast(CursorResult[Any], session.execute(statement))
    return result.rowcount


def claim_pending_or_stale(
    session: Session,
    model: Any,
    pk: int,
    pending: Any,
    working: Any,
    stale_after: timedelta,
    **values: Any,
) -> bool:
    """Move row ``pk`` of ``model`` to ``working`` when it is ``pending``, or ``working`` but
    not touched for ``stale_after`` (its worker died); True when this caller won it."""
    statement = (
        update(model)
        .where(model.id == pk)
        .where(
            or_(
                model.state == pending,
                (model.state == working) & (model.updated_at < utcnow() - stale_after),
            )
        )
        .values(state=working, updated_at=utcnow(), **values)
    )
    return claim_rows(session, statement) == 1


@contextlib.contextmanager
def keep_claimed(
    rt: RelayContext, model: Any, pk: int, working: Any, stale_after: timedelta
) -> Iterator[None]:
    """Touch row ``pk`` (while it is ``working``) a few times per ``stale_after`` for the
    duration of the block, so "stale" means "its worker is gone", not "its work takes long":
    without it, a shard or triage outlasting ``stale_after`` would be claimed again and run a
    second time beside the first."""
    every = min(max(stale_after.total_seconds() / 4, 1.0), 300.0)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            try:
                with rt.db.session() as session:
                    session.execute(
                        update(model)
                        .where(model.id == pk, model.state == working)
                        .values(updated_at=utcnow())
                    )
            except Exception:  # the next beat tries again; a missed one costs nothing
                log.exception("%s %s: heartbeat not stored", model.__name__, pk)

    thread = threading.Thread(target=beat, name=f"{model.__name__}-{pk}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def delivery_event(delivery: Delivery) -> tuple[str, dict[str, Any]]:
    """The upstream event and payload a stored delivery carries (unwrapping CRCR envelopes)."""
    data = json.loads(delivery.body)
    if delivery.source in ("dispatch", "nightly"):  # a CRCR envelope, or our own nightly
        envelope = data.get("client_payload", data)
        return str(envelope["event_type"]), dict(envelope["payload"])
    return delivery.event, data


def report_steps(message_ids: list[int]) -> list[Next]:
    """Send steps for outbox messages just written (reporting.sender sends them)."""
    return [Next("report", pk) for pk in message_ids]
