"""PyTorch HUD: post our result in HUD's ingestion format, authenticated by its bot token."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from ci_relay.context import RelayContext
from ci_relay.reporting.build import load_facts, render_hud
from ci_relay.reporting.transport import Rejected, Send, SendContext, check, request
from ci_relay.reporting.wire import MAX_SEND_BYTES
from ci_relay.store.models import OutboxMessage

TARGET = "hud"
TOKEN_HEADER = "x-hud-internal-bot"


def prepare(session: Session, rt: RelayContext, message: OutboxMessage) -> Send:
    settings = rt.settings
    url = settings.hud_url
    if not url:
        raise Rejected("CI_RELAY_HUD_URL is not set")
    if not settings.hud_upload_token:
        raise Rejected("CI_RELAY_HUD_UPLOAD_TOKEN is not set")
    event = str(message.payload.get("event", "completed"))
    facts = load_facts(session, message.run_id, with_failures=event == "completed")
    body = render_hud(facts, settings, event, MAX_SEND_BYTES)
    headers = {
        "content-type": "application/json",
        "user-agent": "ci-relay",
        TOKEN_HEADER: settings.hud_upload_token.get_secret_value(),
    }

    def send(ctx: SendContext) -> dict[str, Any]:
        response = request(ctx.client, "POST", url, content=body, headers=headers)
        check(response, ctx.now)
        return {"status": response.status_code, "bytes": len(body), "event": event}

    return send
