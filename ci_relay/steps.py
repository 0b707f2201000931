"""The step protocol the pipeline, intake, replay and reporting share.

Intake and reporting must not import the pipeline (it imports them); what they need from it
lives here: the task a committed step hands on (``Next``, ``report_steps``), the
conditional-UPDATE claims (``claim_rows``, ``claim_pending_or_stale``) and the upstream event
a stored delivery carries (``delivery_event``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, or_, update
from sqlalchemy.orm import Session

from ci_relay.store.models import Delivery, utcnow


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
