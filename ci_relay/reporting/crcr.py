"""The CRCR callback: tell PyTorch's Cross-Repository CI Relay how our job is doing.

The body is the ``callback_payload`` HUD later keeps (event, delivery, upstream payload,
``workflow``). The relay forwards it to HUD, so it is held to HUD's size limit too.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from ci_relay.context import RelayContext
from ci_relay.reporting.build import load_facts, render_callback
from ci_relay.reporting.transport import Rejected, Send, SendContext, check, request
from ci_relay.reporting.wire import MAX_SEND_BYTES
from ci_relay.store.models import OutboxMessage

TARGET = "crcr"


def prepare(session: Session, rt: RelayContext, message: OutboxMessage) -> Send:
    settings = rt.settings
    url = settings.crcr_callback_url
    if not url:
        raise Rejected("CI_RELAY_CRCR_CALLBACK_URL is not set")
    event = str(message.payload.get("event", "completed"))
    facts = load_facts(session, message.run_id, with_failures=event == "completed")
    body = render_callback(facts, settings, event, MAX_SEND_BYTES)
    headers = {"content-type": "application/json", "user-agent": "ci-relay"}
    if settings.crcr_callback_token:
        headers["authorization"] = f"Bearer {settings.crcr_callback_token.get_secret_value()}"

    def send(ctx: SendContext) -> dict[str, Any]:
        response = request(ctx.client, "POST", url, content=body, headers=headers)
        check(response, ctx.now)
        return {"status": response.status_code, "bytes": len(body), "event": event}

    return send
