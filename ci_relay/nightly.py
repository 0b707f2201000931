"""The nightly run: once a day the upstream branch head is tested and reported as CRCR's
nightly (``event_type: nightly``, the upstream sha as the delivery id).

The clock is the reconciler's (it runs beside every worker, in the embedded mode too): each
pass asks :func:`nightly_steps` whether today's nightly is due. A nightly is stored as a
delivery (source ``nightly``, hook ``nightly``, delivery id the sha) whose envelope reads like
a CRCR dispatch, so it goes through process, select, execute, collect and the reports as any
event does; the unique (hook, delivery id) makes two workers' clocks start it once. Its
change is the range since the last nightly; the first nightly, and every one under
``nightly_scope: all``, runs the whole spec universe instead.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, time

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from ci_relay.checkouts import CheckoutError, upstream_mirror
from ci_relay.context import RelayContext
from ci_relay.settings import Settings
from ci_relay.steps import Next
from ci_relay.store.models import Delivery, DeliveryState, utcnow

log = logging.getLogger("ci_relay.nightly")

HOOK = "nightly"
EVENT = "nightly"


def scheduled_time(settings: Settings, now: datetime) -> datetime | None:
    """Today's nightly moment (UTC), or None when no nightly is configured."""
    if not settings.nightly_at or not settings.nightly_repository:
        return None
    hours, minutes = (int(part) for part in settings.nightly_at.split(":"))
    return datetime.combine(now.date(), time(hours, minutes), tzinfo=now.tzinfo)


def _last(rt: RelayContext) -> Delivery | None:
    with rt.db.session() as session:
        last = session.scalars(
            select(Delivery).where(Delivery.hook_id == HOOK).order_by(Delivery.id.desc())
        ).first()
        if last is not None:
            session.expunge(last)
        return last


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def nightly_steps(rt: RelayContext, now: datetime | None = None, force: bool = False) -> list[Next]:
    """Start today's nightly when its time has come and it has not run since (``force``:
    now, whatever the clock says); the process step it needs, or nothing."""
    now = now or utcnow()
    settings = rt.settings
    moment = scheduled_time(settings, now)
    if moment is None:
        if force:
            raise ValueError("no nightly is configured (CI_RELAY_NIGHTLY_REPOSITORY)")
        return []
    last = _last(rt)
    if not force:
        if now < moment:
            return []
        if last is not None and _aware(last.received_at) >= moment:
            return []  # today's has started
    assert settings.nightly_repository is not None
    try:
        head = upstream_mirror(settings).branch_head(settings.nightly_branch)
    except CheckoutError as exc:
        log.error("nightly not started: %s", exc)
        return []
    if last is not None and last.head_sha == head:
        log.info("nightly: %s is still at %s, tested last time", settings.nightly_branch, head[:12])
        return []
    before = last.head_sha if last is not None and settings.nightly_scope == "range" else None
    envelope = {
        "event_type": EVENT,
        "delivery_id": head,
        "payload": {
            "repository": {"full_name": settings.nightly_repository},
            "ref": f"refs/heads/{settings.nightly_branch}",
            "after": head,
            "before": before,
            "scope": settings.nightly_scope,
        },
    }
    with rt.db.session() as session:
        delivery = Delivery(
            source="nightly",
            hook_id=HOOK,
            delivery_id=head,
            event=EVENT,
            repository=settings.nightly_repository,
            head_sha=head,
            state=DeliveryState.RECEIVED,
            headers={},
            body=json.dumps(envelope).encode(),
            # the clock that decided it is due: "has today's started" compares with this
            received_at=now,
            enqueued_at=utcnow(),
        )
        session.add(delivery)
        try:
            session.flush()
        except IntegrityError:  # another worker's clock started the same nightly
            session.rollback()
            return []
        pk = delivery.id
    log.info(
        "nightly: %s %s at %s (%s)",
        settings.nightly_repository,
        settings.nightly_branch,
        head[:12],
        f"since {before[:12]}"
        if before
        else "whole universe"
        if settings.nightly_scope == "all"
        else "first",
    )
    return [Next("process", pk)]
