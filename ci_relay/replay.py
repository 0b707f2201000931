"""``ci-relay replay``: put a stored or saved delivery through the pipeline again."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from sqlalchemy import select

from ci_relay.intake.events import InvalidPayload, summarize
from ci_relay.settings import Settings
from ci_relay.steps import Next
from ci_relay.store.models import Delivery, DeliveryState, utcnow


class ReplayError(RuntimeError):
    pass


def replay_delivery(settings: Settings, source: str, event: str | None) -> int:
    """Store a copy as a new delivery (source ``replay``) and enqueue it; returns its id."""
    from ci_relay.service.tasks import configure, enqueue

    rt = configure(settings)
    rt.db.upgrade()
    path = Path(source)
    with rt.db.session() as session:
        if path.is_file():
            if not event:
                raise ReplayError("a payload file needs --event (the X-GitHub-Event name)")
            body = path.read_bytes()
            try:
                payload = json.loads(body)
            except json.JSONDecodeError as exc:
                raise ReplayError(f"{path} is not JSON: {exc}") from None
            origin = path.name
        else:
            original = session.scalars(
                select(Delivery).where(Delivery.delivery_id == source).order_by(Delivery.id)
            ).first()
            if original is None:
                raise ReplayError(f"no stored delivery {source!r} and no such file")
            body, event, origin = original.body, original.event, original.delivery_id
            payload = json.loads(body)
            if original.source == "dispatch":
                envelope = payload.get("client_payload", payload)
                event, payload = envelope["event_type"], envelope["payload"]
                body = json.dumps(payload).encode()
        try:
            meaning = summarize(event, payload)
        except InvalidPayload as exc:  # the intake would refuse it too
            raise ReplayError(f"{origin} is refused: {exc}") from None
        row = Delivery(
            source="replay",
            hook_id="replay",
            delivery_id=f"replay-{uuid.uuid4()}",
            event=event,
            action=meaning.action,
            repository=meaning.repository,
            head_sha=meaning.head_sha,
            state=DeliveryState.RECEIVED,
            reason=f"replay of {origin}",
            headers={},
            body=body,
            enqueued_at=utcnow(),
        )
        session.add(row)
        session.flush()
        pk = row.id
    enqueue([Next("process", pk)])
    return pk
