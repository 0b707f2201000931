"""Queueing reports: one outbox row per configured target, written in the step's transaction.

The pipeline calls :func:`enqueue_reports` when a run starts executing (``in_progress``)
and when it finishes (``completed``). A newer report of a run supersedes an older one
still waiting for the same target: the completed report says everything the other did.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ci_relay.context import RelayContext
from ci_relay.reporting.levels import github_plan
from ci_relay.store.models import OutboxMessage, OutboxState, Run, utcnow

EVENTS = ("in_progress", "completed")
OPEN = (OutboxState.PENDING, OutboxState.SENDING)


def targets(rt: RelayContext, run: Run, event: str) -> list[tuple[str, dict[str, Any], str | None]]:
    """(target, payload, key) of every report this run's event makes, as settings say."""
    settings = rt.settings
    out: list[tuple[str, dict[str, Any], str | None]] = []
    if run.change.kind == "upgrade":  # a release range tested for the spec maintainers
        return out
    if settings.crcr_callback_url:
        out.append(("crcr", {"event": event}, None))
    if settings.hud_url:
        out.append(("hud", {"event": event}, None))
    planned = github_plan(settings, rt.policy, run, event)
    if planned is not None:
        out.append(("github", planned[0], planned[1]))
    return out


def enqueue_reports(session: Session, rt: RelayContext, run: Run, event: str) -> list[int]:
    """Add this event's reports to the outbox (in the caller's transaction); their ids."""
    if event not in EVENTS:
        raise ValueError(f"unknown report event {event!r}")
    messages: list[OutboxMessage] = []
    for target, payload, key in targets(rt, run, event):
        session.execute(
            update(OutboxMessage)
            .where(
                OutboxMessage.run_id == run.id,
                OutboxMessage.target == target,
                OutboxMessage.state == OutboxState.PENDING,
            )
            .values(state=OutboxState.SUPERSEDED)
        )
        message = OutboxMessage(
            run_id=run.id,
            target=target,
            payload=payload,
            key=key,
            state=OutboxState.PENDING,
            next_attempt_at=utcnow(),
        )
        session.add(message)
        messages.append(message)
    session.flush()
    return [m.id for m in messages]


def due(session: Session, now: datetime, limit: int = 1000) -> list[int]:
    """Messages whose time has come: pending ones, and sending ones whose sender vanished."""
    return list(
        session.scalars(
            select(OutboxMessage.id)
            .where(OutboxMessage.state.in_(OPEN), OutboxMessage.next_attempt_at <= now)
            .order_by(OutboxMessage.id)
            .limit(limit)
        )
    )
