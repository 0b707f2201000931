"""``POST /webhooks/github`` and ``POST /webhooks/dispatch``: verify, store raw, enqueue, 202.

Rejected requests leave only an audit record. Accepted ones are stored before
anything else happens, so a crash after the answer loses nothing: the
reconciler finds the row.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool

from ci_relay.intake.events import Interpretation, summarize
from ci_relay.intake.signature import verify
from ci_relay.logs import delivery_context
from ci_relay.metrics import Metrics
from ci_relay.pipeline import Next
from ci_relay.request_body import BodyTooLarge, read_body_at_most
from ci_relay.runtime import Runtime
from ci_relay.store.models import AuditRecord, Delivery, DeliveryState, utcnow

log = logging.getLogger("ci_relay.intake")

HANDLED_EVENTS = {"pull_request", "push", "check_run", "check_suite"}


class DispatchEnvelope(BaseModel):
    """What PyTorch's Cross-Repository CI Relay sends downstream (``client_payload``)."""

    model_config = ConfigDict(extra="allow")

    event_type: str
    delivery_id: str
    payload: dict[str, Any]


def make_router(rt: Runtime, metrics: Metrics, enqueue: Callable[[list[Next]], None]) -> APIRouter:
    router = APIRouter()
    settings = rt.settings

    def audit(request: Request, status: int, reason: str, event: str | None = None) -> None:
        with rt.db.session() as session:
            session.add(
                AuditRecord(
                    path=request.url.path,
                    status=status,
                    reason=reason,
                    remote=request.client.host if request.client else None,
                    event=event,
                    delivery_id=request.headers.get("x-github-delivery"),
                )
            )

    async def reject(
        request: Request, status: int, reason: str, event: str | None, started: float
    ) -> JSONResponse:
        await run_in_threadpool(audit, request, status, reason, event)
        metrics.deliveries.labels(event or "unknown", f"rejected_{status}").inc()
        metrics.ack_seconds.observe(time.perf_counter() - started)
        log.warning("rejected %s: %s (%s)", request.url.path, reason, status)
        return JSONResponse({"error": reason}, status_code=status)

    def store(
        source: str,
        hook_id: str,
        delivery_id: str,
        event: str,
        body: bytes,
        headers: dict[str, str],
        meaning: Interpretation,
    ) -> tuple[int, str, bool]:
        state, reason = DeliveryState.RECEIVED, None
        if event not in HANDLED_EVENTS:
            state, reason = DeliveryState.IGNORED, f"event {event} is not handled"
        row = Delivery(
            source=source,
            hook_id=hook_id,
            delivery_id=delivery_id,
            event=event,
            action=meaning.action,
            repository=meaning.repository,
            head_sha=meaning.head_sha,
            state=state,
            reason=reason,
            headers=headers,
            body=body,
            enqueued_at=utcnow() if state == DeliveryState.RECEIVED else None,
        )
        try:
            with rt.db.session() as session:
                session.add(row)
                session.flush()
                return row.id, state, False
        except IntegrityError:  # a redelivery: same (hook id, delivery id)
            with rt.db.session() as session:
                existing = session.scalars(
                    select(Delivery).where(
                        Delivery.hook_id == hook_id, Delivery.delivery_id == delivery_id
                    )
                ).one()
                return existing.id, existing.state, True

    async def accept(
        request: Request,
        source: str,
        hook_id: str,
        delivery_id: str,
        event: str,
        body: bytes,
        headers: dict[str, str],
        payload: dict[str, Any],
        started: float,
    ) -> JSONResponse:
        meaning = summarize(event, payload)
        repository = meaning.repository
        if rt.policy.for_repository(repository) is None:
            reason = f"repository {repository} is not in the allowlist"
            await run_in_threadpool(audit, request, 202, reason, event)
            metrics.deliveries.labels(event, "not_allowed").inc()
            metrics.ack_seconds.observe(time.perf_counter() - started)
            log.info("delivery=%s event=%s ignored: %s", delivery_id, event, reason)
            return JSONResponse(
                {"delivery_id": delivery_id, "state": DeliveryState.IGNORED, "reason": reason},
                status_code=202,
            )
        pk, state, duplicate = await run_in_threadpool(
            store, source, hook_id, delivery_id, event, body, headers, meaning
        )
        if state == DeliveryState.RECEIVED and not duplicate:
            await run_in_threadpool(enqueue, [Next("process", pk)])
        outcome = "duplicate" if duplicate else state
        metrics.deliveries.labels(event, outcome).inc()
        metrics.ack_seconds.observe(time.perf_counter() - started)
        log.info("delivery=%s event=%s id=%s outcome=%s", delivery_id, event, pk, outcome)
        return JSONResponse(
            {"id": pk, "delivery_id": delivery_id, "state": state, "duplicate": duplicate},
            status_code=202,
        )

    @router.post("/webhooks/github")
    async def github_webhook(request: Request) -> JSONResponse:
        with delivery_context(request.headers.get("x-github-delivery")):
            return await _github_webhook(request)

    async def _github_webhook(request: Request) -> JSONResponse:
        started = time.perf_counter()
        event = request.headers.get("x-github-event")
        try:
            body = await read_body_at_most(request, settings.max_body_bytes)
        except BodyTooLarge:
            return await reject(
                request, 413, f"body over {settings.max_body_bytes} bytes", event, started
            )
        secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else None
        signature = request.headers.get("x-hub-signature-256")
        if secret is not None and not verify(secret, body, signature):
            reason = "missing X-Hub-Signature-256" if not signature else "signature mismatch"
            return await reject(request, 401, reason, event, started)
        delivery_id = request.headers.get("x-github-delivery")
        if not event or not delivery_id:
            missing = "X-GitHub-Event" if not event else "X-GitHub-Delivery"
            return await reject(request, 400, f"missing header {missing}", event, started)
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return await reject(request, 400, f"body is not JSON: {exc}", event, started)
        if not isinstance(payload, dict):
            return await reject(request, 400, "body is not a JSON object", event, started)
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.startswith("x-github-") or k in ("user-agent", "content-type")
        }
        hook_id = request.headers.get("x-github-hook-id", "")
        if event == "ping":  # recorded (as ignored) and answered 200, as GitHub expects
            await run_in_threadpool(
                store,
                "github",
                hook_id,
                delivery_id,
                event,
                body,
                headers,
                summarize(event, payload),
            )
            metrics.deliveries.labels("ping", "pong").inc()
            return JSONResponse({"pong": True, "zen": payload.get("zen")}, status_code=200)
        return await accept(
            request, "github", hook_id, delivery_id, event, body, headers, payload, started
        )

    @router.post("/webhooks/dispatch")
    async def crcr_dispatch(request: Request) -> JSONResponse:
        started = time.perf_counter()
        try:
            body = await read_body_at_most(request, settings.max_body_bytes)
        except BodyTooLarge:
            return await reject(
                request, 413, f"body over {settings.max_body_bytes} bytes", None, started
            )
        token = settings.dispatch_token.get_secret_value() if settings.dispatch_token else None
        auth = request.headers.get("authorization", "")
        if token is None or not _same(auth, f"Bearer {token}"):
            reason = "dispatch is disabled (no token set)" if token is None else "bad bearer token"
            return await reject(request, 401, reason, None, started)
        try:
            data = json.loads(body)
            envelope = DispatchEnvelope.model_validate(
                data.get("client_payload", data) if isinstance(data, dict) else data
            )
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return await reject(request, 400, f"body is not JSON: {exc}", None, started)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "body"
            return await reject(
                request, 422, f"envelope field {field}: {first['msg']}", None, started
            )
        with delivery_context(envelope.delivery_id):
            return await accept(
                request,
                "dispatch",
                "crcr",
                envelope.delivery_id,
                envelope.event_type,
                body,
                {"user-agent": request.headers.get("user-agent", "")},
                envelope.payload,
                started,
            )

    return router


def _same(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())
