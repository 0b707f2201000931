"""Sending outbox messages: claim a due row, send it, write down what happened.

The row is the truth. A sender claims it with a conditional update (state ``sending``,
``attempts`` + 1, ``next_attempt_at`` pushed out as a lease), so two senders never send
it at once and a sender that dies mid-send only delays it until the lease ends. Reports
of one run to one target go out in order: a row waits while an older one is in flight.
Outcomes: ``sent``; ``failed`` when the target refused it (4xx other than 408/429); else
``pending`` again with ``last_error`` and a ``next_attempt_at`` from ``Retry-After`` or
exponential backoff. Nothing but a refusal ever stops the retries.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session, aliased

from ci_relay.context import RelayContext
from ci_relay.reporting import crcr, github, hud
from ci_relay.reporting.build import aware
from ci_relay.reporting.caps import ReportTooLarge
from ci_relay.reporting.outbox import OPEN, due
from ci_relay.reporting.transport import Rejected, RetryLater, Send, SendContext
from ci_relay.settings import Settings
from ci_relay.steps import claim_rows
from ci_relay.store.models import OutboxMessage, OutboxState, utcnow

log = logging.getLogger("ci_relay.reporting")

LEASE = timedelta(minutes=10)  # longer than the slowest send (GitHub: up to 21 requests)
MAX_ERROR = 8000
MIN_DELAY = timedelta(seconds=1)  # even "Retry-After: 0" must not become a busy loop

Prepare = Callable[[Session, RelayContext, OutboxMessage], Send]
TARGETS: dict[str, Prepare] = {
    crcr.TARGET: crcr.prepare,
    hud.TARGET: hud.prepare,
    github.TARGET: github.prepare,
}


@dataclass(frozen=True)
class Attempt:
    """What one ``deliver`` call did; ``state`` is None when the row was not ours to send."""

    message_id: int
    state: str | None
    retry_in: float | None = None  # seconds until the next attempt, when one is due
    error: str | None = None
    unblocked: list[int] = field(default_factory=list)  # later reports that waited for this


_clients = threading.local()


def thread_client(settings: Settings) -> httpx.Client:
    """This thread's HTTP client, kept between messages: making one costs ~35 ms of CPU
    (its TLS context), more than rendering and sending a report, and a kept one reuses
    its connections. One per thread (a Celery worker thread), so none is shared."""
    timeout = settings.report_timeout_seconds
    client: httpx.Client | None = getattr(_clients, "client", None)
    if client is None or client.is_closed or _clients.timeout != timeout:
        if client is not None:
            client.close()
        client = httpx.Client(timeout=timeout)
        _clients.client, _clients.timeout = client, timeout
    return client


def backoff(settings: Settings, attempts: int) -> timedelta:
    """Exponential backoff with 10 % jitter, capped: base, 2 base, 4 base, ..."""
    base = settings.report_retry_base_seconds * 2 ** min(max(attempts - 1, 0), 40)
    jittered = base * (1 + random.random() * 0.1)
    return timedelta(seconds=min(settings.report_retry_max_seconds, jittered))


def _claim(session: Session, message_id: int, now: datetime) -> bool:
    older = aliased(OutboxMessage)
    in_flight_before = (
        select(older.id)
        .where(
            older.run_id == OutboxMessage.run_id,
            older.target == OutboxMessage.target,
            older.id < OutboxMessage.id,
            older.state.in_(OPEN),
        )
        .exists()
    )
    return (
        claim_rows(
            session,
            update(OutboxMessage)
            .where(
                OutboxMessage.id == message_id,
                OutboxMessage.state.in_(OPEN),
                OutboxMessage.next_attempt_at <= now,
                ~in_flight_before,
            )
            .values(
                state=OutboxState.SENDING,
                attempts=OutboxMessage.attempts + 1,
                next_attempt_at=now + LEASE,
            ),
        )
        == 1
    )


def _mine(message_id: int, attempts: int) -> Any:
    """Only the sender holding this claim may write the row (a later claim changed attempts)."""
    return (
        (OutboxMessage.id == message_id)
        & (OutboxMessage.state == OutboxState.SENDING)
        & (OutboxMessage.attempts == attempts)
    )


def _earlier_results(session: Session, message: OutboxMessage) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for result in session.scalars(
        select(OutboxMessage.result)
        .where(
            OutboxMessage.run_id == message.run_id,
            OutboxMessage.target == message.target,
            OutboxMessage.id < message.id,
            OutboxMessage.state == OutboxState.SENT,
        )
        .order_by(OutboxMessage.id)
    ):
        merged.update(result or {})
    return merged


def _waiting_after(session: Session, message_id: int) -> list[int]:
    row = session.get(OutboxMessage, message_id)
    if row is None:
        return []
    return list(
        session.scalars(
            select(OutboxMessage.id).where(
                OutboxMessage.run_id == row.run_id,
                OutboxMessage.target == row.target,
                OutboxMessage.id > row.id,
                OutboxMessage.state == OutboxState.PENDING,
            )
        )
    )


def deliver(
    rt: RelayContext,
    message_id: int,
    now: datetime | None = None,
    client: httpx.Client | None = None,
) -> Attempt:
    """Send one message if it is due and nobody else holds it; record the outcome."""
    now = now or utcnow()
    send: Send | None = None
    error: Exception | None = None
    result: dict[str, Any] = {}
    with rt.db.session() as session:
        if not _claim(session, message_id, now):
            return Attempt(message_id, None)
        message = session.get(OutboxMessage, message_id)
        assert message is not None
        attempts, target = message.attempts, message.target
        context = {"earlier": _earlier_results(session, message), "own": dict(message.result or {})}
        prepare = TARGETS.get(target)
        try:
            if prepare is None:
                raise Rejected(f"no reporter for target {target!r}")
            send = prepare(session, rt, message)
        except Exception as exc:  # recorded below, after this read-only session
            error = exc
    if send is not None:
        try:
            ctx = SendContext(
                client or thread_client(rt.settings),
                now,
                earlier=context["earlier"],
                own=context["own"],
                save=lambda progress: _save(rt, message_id, attempts, progress),
            )
            result = send(ctx)
        except Exception as exc:
            error = exc
    if error is None:
        return _record(rt, message_id, attempts, now, OutboxState.SENT, result=result)
    if isinstance(error, Rejected | ReportTooLarge):
        reason = error.reason if isinstance(error, Rejected) else str(error)
        return _record(rt, message_id, attempts, now, OutboxState.FAILED, error=reason)
    if isinstance(error, RetryLater):
        return _record(
            rt, message_id, attempts, now, OutboxState.PENDING, error.reason, until=error.until
        )
    log.exception("report %s (%s) raised", message_id, target, exc_info=error)
    reason = f"{type(error).__name__}: {error}"
    return _record(rt, message_id, attempts, now, OutboxState.PENDING, error=reason)


def _save(rt: RelayContext, message_id: int, attempts: int, progress: dict[str, Any]) -> None:
    """Keep what a multi-request send achieved so far; a retry continues from here."""
    with rt.db.session() as session:
        session.execute(
            update(OutboxMessage).where(_mine(message_id, attempts)).values(result=progress)
        )


def _record(
    rt: RelayContext,
    message_id: int,
    attempts: int,
    now: datetime,
    state: str,
    error: str | None = None,
    result: dict[str, Any] | None = None,
    until: datetime | None = None,
) -> Attempt:
    values: dict[str, Any] = {"state": state}
    retry_in: float | None = None
    if error is not None:
        values["last_error"] = error[:MAX_ERROR]
    if state == OutboxState.SENT:
        values.update(sent_at=utcnow(), result=result)
    with rt.db.session() as session:
        if state == OutboxState.PENDING:
            row = session.get(OutboxMessage, message_id)
            newer = row and session.scalar(
                select(OutboxMessage.id).where(
                    OutboxMessage.run_id == row.run_id,
                    OutboxMessage.target == row.target,
                    OutboxMessage.id > row.id,
                )
            )
            if newer is not None:  # a newer report of this run says more: this one is done
                state = values["state"] = OutboxState.SUPERSEDED
            else:
                at = max(aware(until) or now + backoff(rt.settings, attempts), now + MIN_DELAY)
                values["next_attempt_at"] = at
                retry_in = (at - now).total_seconds()
        changed = update(OutboxMessage).where(_mine(message_id, attempts)).values(**values)
        if not claim_rows(session, changed):
            return Attempt(message_id, None)  # our lease ended and another sender took over
        unblocked = [] if state == OutboxState.PENDING else _waiting_after(session, message_id)
    if state == OutboxState.SENT:
        log.info("report %s sent", message_id)
    else:
        log.warning("report %s %s: %s", message_id, state, error)
    return Attempt(message_id, state, retry_in, error, unblocked)


def deliver_due(
    rt: RelayContext, now: datetime | None = None, client: httpx.Client | None = None
) -> list[Attempt]:
    """Send every message that is due now, oldest first (a sweep, as after a restart)."""
    now = now or utcnow()
    with rt.db.session() as session:
        ids = due(session, now)
    http = client or thread_client(rt.settings)
    return [deliver(rt, message_id, now, http) for message_id in ids]
