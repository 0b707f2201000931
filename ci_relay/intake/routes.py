"""``POST /webhooks/github`` and ``POST /webhooks/dispatch``: verify, store raw, enqueue, 202.

Checks run in the order that costs a bad caller least: size (413, counted while
streaming), signature or token (401), headers (400), JSON (400), then every field the
relay will use (422 naming it: commit ids, repository, refs, labels, numbers). Rejected
requests leave only a bounded audit record (:mod:`ci_relay.audit`). Accepted ones are
stored before anything else happens, so a crash after the answer loses nothing: the
reconciler finds the row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Security
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool

from ci_relay.api_docs import DISPATCH_AUTH, Accepted, Pong, errors, header, json_body
from ci_relay.audit import AuditLog
from ci_relay.context import RelayContext
from ci_relay.identifiers import (
    DELIVERY_ID_PATTERN,
    EVENT_PATTERN,
    InvalidIdentifier,
)
from ci_relay.identifiers import (
    delivery_id as check_delivery_id,
)
from ci_relay.identifiers import event_name as check_event_name
from ci_relay.identifiers import hook_id as check_hook_id
from ci_relay.intake.events import Interpretation, InvalidPayload, summarize
from ci_relay.intake.signature import verify
from ci_relay.intake.wire import DispatchEnvelope, UpgradeAccepted, UpgradeRequest
from ci_relay.logs import delivery_context
from ci_relay.metrics import Metrics
from ci_relay.request_body import BodyTooLarge, parse_json, read_body_at_most
from ci_relay.steps import Next
from ci_relay.store.models import Delivery, DeliveryState, Upgrade, utcnow

log = logging.getLogger("ci_relay.intake")

HANDLED_EVENTS = {"pull_request", "push", "check_run", "check_suite"}


def _metric_event(event: str | None) -> str:
    """A metric label: the events we know by name, anything else (caller-chosen) as one."""
    if event is None:
        return "unknown"
    return event if event in HANDLED_EVENTS or event == "ping" else "other"


def _github_headers(request: Request) -> tuple[str, str, str] | str:
    """(event, delivery id, hook id) from GitHub's headers, or what is wrong with them."""
    event = request.headers.get("x-github-event")
    delivery = request.headers.get("x-github-delivery")
    hook = request.headers.get("x-github-hook-id", "")
    if not event or not delivery:
        return f"missing header {'X-GitHub-Event' if not event else 'X-GitHub-Delivery'}"
    for name, value, check in (
        ("X-GitHub-Event", event, check_event_name),
        ("X-GitHub-Delivery", delivery, check_delivery_id),
        ("X-GitHub-Hook-ID", hook, check_hook_id),
    ):
        if value or name != "X-GitHub-Hook-ID":
            try:
                check(value)
            except InvalidIdentifier as exc:
                return f"header {name}: {exc}"
    return event, delivery, hook


def make_router(
    rt: RelayContext,
    metrics: Metrics,
    enqueue: Callable[[list[Next]], None],
    audit_log: AuditLog,
) -> APIRouter:
    router = APIRouter()
    settings = rt.settings

    def audit(request: Request, status: int, reason: str, event: str | None = None) -> None:
        audit_log.record(
            request.url.path,
            status,
            reason,
            request.client.host if request.client else None,
            event,
            request.headers.get("x-github-delivery"),
        )

    async def reject(
        request: Request, status: int, reason: str, event: str | None, started: float
    ) -> JSONResponse:
        await run_in_threadpool(audit, request, status, reason, event)
        metrics.deliveries.labels(_metric_event(event), f"rejected_{status}").inc()
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
        field_prefix: str = "",
    ) -> JSONResponse:
        try:
            meaning = summarize(event, payload)
        except InvalidPayload as exc:
            return await reject(request, 422, f"{field_prefix}{exc}", event, started)
        repository = meaning.repository
        if rt.policy.for_repository(repository) is None:
            reason = f"repository {repository} is not in the allowlist"
            await run_in_threadpool(audit, request, 202, reason, event)
            metrics.deliveries.labels(_metric_event(event), "not_allowed").inc()
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
        metrics.deliveries.labels(_metric_event(event), outcome).inc()
        metrics.ack_seconds.observe(time.perf_counter() - started)
        log.info("delivery=%s event=%s id=%s outcome=%s", delivery_id, event, pk, outcome)
        return JSONResponse(
            {"id": pk, "delivery_id": delivery_id, "state": state, "duplicate": duplicate},
            status_code=202,
        )

    too_large = f"body over {settings.max_body_bytes} bytes"

    async def read_within_limit(request: Request) -> bytes | None:
        """The body, or None when it is over the limit (counted as it streams in)."""
        try:
            return await read_body_at_most(request, settings.max_body_bytes)
        except BodyTooLarge:
            return None

    @router.post(
        "/webhooks/github",
        status_code=202,
        response_model=Accepted,
        responses={
            200: {"model": Pong, "description": "a ping, recorded"},
            **errors(400, 401, 413, 422),
        },
        openapi_extra={
            **json_body({"type": "object"}, "a GitHub webhook payload, signed as received"),
            "parameters": [
                header("X-GitHub-Event", "the event, e.g. pull_request", pattern=EVENT_PATTERN),
                header(
                    "X-GitHub-Delivery",
                    "the delivery's id (the idempotency key)",
                    pattern=DELIVERY_ID_PATTERN,
                ),
                header("X-GitHub-Hook-ID", "the hook's id", False, "^([0-9]{1,20})?$"),
                header(
                    "X-Hub-Signature-256",
                    "sha256=HMAC of the body with the webhook secret",
                    required=False,
                ),
            ],
        },
    )
    async def github_webhook(request: Request) -> JSONResponse:
        with delivery_context(request.headers.get("x-github-delivery")):
            return await _github_webhook(request)

    async def _github_webhook(request: Request) -> JSONResponse:
        started = time.perf_counter()
        event = request.headers.get("x-github-event")
        body = await read_within_limit(request)
        if body is None:
            return await reject(request, 413, too_large, event, started)
        secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else None
        signature = request.headers.get("x-hub-signature-256")
        if secret is not None and not verify(secret, body, signature):
            reason = "missing X-Hub-Signature-256" if not signature else "signature mismatch"
            return await reject(request, 401, reason, event, started)
        named = _github_headers(request)
        if isinstance(named, str):
            return await reject(request, 400, named, event, started)
        event, delivery_id, hook_id = named
        try:
            payload = parse_json(body)
        except ValueError as exc:  # bad UTF-8 or syntax, giant ints, nesting, surrogates
            return await reject(request, 400, f"body is not JSON: {exc}", event, started)
        if not isinstance(payload, dict):
            return await reject(request, 400, "body is not a JSON object", event, started)
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.startswith("x-github-") or k in ("user-agent", "content-type")
        }
        if event == "ping":  # recorded (as ignored) and answered 200, as GitHub expects
            try:
                meaning = summarize(event, payload)
            except InvalidPayload as exc:
                return await reject(request, 422, str(exc), event, started)
            await run_in_threadpool(
                store, "github", hook_id, delivery_id, event, body, headers, meaning
            )
            metrics.deliveries.labels("ping", "pong").inc()
            zen = payload.get("zen")
            return JSONResponse(
                {"pong": True, "zen": zen if isinstance(zen, str) else None}, status_code=200
            )
        return await accept(
            request, "github", hook_id, delivery_id, event, body, headers, payload, started
        )

    @router.post(
        "/webhooks/dispatch",
        status_code=202,
        response_model=Accepted,
        responses=errors(400, 401, 413, 422),
        openapi_extra={
            **json_body(
                DispatchEnvelope.model_json_schema(),
                "the CRCR envelope, bare or as a repository_dispatch body's client_payload",
            ),
        },
        dependencies=[Security(DISPATCH_AUTH)],
    )
    async def crcr_dispatch(request: Request) -> JSONResponse:
        started = time.perf_counter()
        body = await read_within_limit(request)
        if body is None:
            return await reject(request, 413, too_large, None, started)
        token = settings.dispatch_token.get_secret_value() if settings.dispatch_token else None
        auth = request.headers.get("authorization", "")
        if token is None or not _same(auth, f"Bearer {token}"):
            reason = "dispatch is disabled (no token set)" if token is None else "bad bearer token"
            return await reject(request, 401, reason, None, started)
        try:
            data = parse_json(body)
        except ValueError as exc:  # bad UTF-8 or syntax, giant ints, nesting, surrogates
            return await reject(request, 400, f"body is not JSON: {exc}", None, started)
        try:
            envelope = DispatchEnvelope.model_validate(
                data.get("client_payload", data) if isinstance(data, dict) else data
            )
        except ValidationError as exc:
            problem = InvalidPayload.from_validation(exc)
            return await reject(request, 422, f"envelope field {problem}", None, started)
        with delivery_context(envelope.delivery_id):
            return await accept(
                request,
                "dispatch",
                "crcr",
                envelope.delivery_id,
                envelope.event_type,
                body,
                {"user-agent": request.headers.get("user-agent", "")[:256]},
                envelope.payload,
                started,
                field_prefix="envelope field payload.",
            )

    @router.post(
        "/api/upgrades",
        status_code=202,
        response_model=UpgradeAccepted,
        responses=errors(400, 401, 413, 422),
        openapi_extra=json_body(UpgradeRequest.model_json_schema(), "the upgrade to test"),
        dependencies=[Security(DISPATCH_AUTH)],
    )
    async def submit_upgrade(request: Request) -> JSONResponse:
        """A release upgrade job (behind the dispatch token): the specs' tests that changed
        between ``base`` and ``head`` run at both on each backend; ``url`` compares them."""
        started = time.perf_counter()
        body = await read_within_limit(request)
        if body is None:
            return await reject(request, 413, too_large, "upgrade", started)
        token = settings.dispatch_token.get_secret_value() if settings.dispatch_token else None
        if token is None or not _same(request.headers.get("authorization", ""), f"Bearer {token}"):
            reason = "upgrades are disabled (no token set)" if token is None else "bad bearer token"
            return await reject(request, 401, reason, "upgrade", started)
        try:
            wanted = UpgradeRequest.model_validate(parse_json(body))
        except ValueError as exc:  # not JSON, or a field pydantic refused (it says which)
            problem = (
                InvalidPayload.from_validation(exc)
                if isinstance(exc, ValidationError)
                else f"body is not JSON: {exc}"
            )
            status = 422 if isinstance(exc, ValidationError) else 400
            return await reject(request, status, str(problem), "upgrade", started)
        repo_policy = rt.policy.for_repository(wanted.repository)
        if repo_policy is None:
            reason = f"repository {wanted.repository} is not in the allowlist"
            return await reject(request, 422, reason, "upgrade", started)
        allowed = sorted(repo_policy.backends)
        backends = wanted.backends or allowed
        unknown = sorted(set(backends) - set(allowed))
        if unknown:
            reason = f"backends {', '.join(unknown)} do not run for {wanted.repository}"
            return await reject(request, 422, reason, "upgrade", started)

        def create() -> int:
            with rt.db.session() as session:
                job = Upgrade(
                    repository=wanted.repository,
                    base_sha=wanted.base,
                    head_sha=wanted.head,
                    backends=list(dict.fromkeys(backends)),
                    plan={},
                )
                session.add(job)
                session.flush()
                return job.id

        upgrade_id = await run_in_threadpool(create)
        await run_in_threadpool(enqueue, [Next("upgrade", upgrade_id)])
        log.info("upgrade %s: %s..%s queued", upgrade_id, wanted.base[:12], wanted.head[:12])
        return JSONResponse(
            {"id": upgrade_id, "url": f"/upgrades/{upgrade_id}", "state": "pending"},
            status_code=202,
        )

    return router


def _same(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())
