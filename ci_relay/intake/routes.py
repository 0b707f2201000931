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
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Security
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
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
from ci_relay.intake.wire import DispatchEnvelope
from ci_relay.logs import delivery_context
from ci_relay.metrics import Metrics
from ci_relay.request_body import BodyTooLarge, parse_json, read_body_at_most
from ci_relay.steps import Next
from ci_relay.store.models import Delivery, DeliveryState, utcnow

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


M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Intake:
    """What every intake route shares: the relay's context and metrics, the queue, the audit
    log; kept on ``app.state.intake`` by ``mount.install``, read by each route."""

    rt: RelayContext
    metrics: Metrics
    enqueue: Callable[[list[Next]], None]
    audit_log: AuditLog

    @property
    def too_large(self) -> str:
        return f"body over {self.rt.settings.max_body_bytes} bytes"

    def audit(self, request: Request, status: int, reason: str, event: str | None = None) -> None:
        self.audit_log.record(
            request.url.path,
            status,
            reason,
            request.client.host if request.client else None,
            event,
            request.headers.get("x-github-delivery"),
        )

    async def reject(
        self, request: Request, status: int, reason: str, event: str | None, started: float
    ) -> JSONResponse:
        await run_in_threadpool(self.audit, request, status, reason, event)
        self.metrics.deliveries.labels(_metric_event(event), f"rejected_{status}").inc()
        self.metrics.ack_seconds.observe(time.perf_counter() - started)
        log.warning("rejected %s: %s (%s)", request.url.path, reason, status)
        return JSONResponse({"error": reason}, status_code=status)

    def store(
        self,
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
            with self.rt.db.session() as session:
                session.add(row)
                session.flush()
                return row.id, state, False
        except IntegrityError:  # a redelivery: same (hook id, delivery id)
            with self.rt.db.session() as session:
                existing = session.scalars(
                    select(Delivery).where(
                        Delivery.hook_id == hook_id, Delivery.delivery_id == delivery_id
                    )
                ).one()
                return existing.id, existing.state, True

    async def accept(
        self,
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
            return await self.reject(request, 422, f"{field_prefix}{exc}", event, started)
        repository = meaning.repository
        if self.rt.policy.for_repository(repository) is None:
            reason = f"repository {repository} is not in the allowlist"
            await run_in_threadpool(self.audit, request, 202, reason, event)
            self.metrics.deliveries.labels(_metric_event(event), "not_allowed").inc()
            self.metrics.ack_seconds.observe(time.perf_counter() - started)
            log.info("delivery=%s event=%s ignored: %s", delivery_id, event, reason)
            return JSONResponse(
                {"delivery_id": delivery_id, "state": DeliveryState.IGNORED, "reason": reason},
                status_code=202,
            )
        pk, state, duplicate = await run_in_threadpool(
            self.store, source, hook_id, delivery_id, event, body, headers, meaning
        )
        if state == DeliveryState.RECEIVED and not duplicate:
            await run_in_threadpool(self.enqueue, [Next("process", pk)])
        outcome = "duplicate" if duplicate else state
        self.metrics.deliveries.labels(_metric_event(event), outcome).inc()
        self.metrics.ack_seconds.observe(time.perf_counter() - started)
        log.info("delivery=%s event=%s id=%s outcome=%s", delivery_id, event, pk, outcome)
        return JSONResponse(
            {"id": pk, "delivery_id": delivery_id, "state": state, "duplicate": duplicate},
            status_code=202,
        )

    async def guarded_body(
        self,
        request: Request,
        model: type[M],
        event: str,
        disabled: str,
        started: float,
        empty: bool = False,
    ) -> M | JSONResponse:
        """A dispatch-token route's body validated by ``model``, or the refusal to return:
        413 over the limit, 401 without the token (``disabled`` when none is set), 400 not
        JSON, 422 a field the model refuses (named). ``empty``: no body reads as ``{}``."""
        body = await self.read_within_limit(request)
        if body is None:
            return await self.reject(request, 413, self.too_large, event, started)
        settings = self.rt.settings
        token = settings.dispatch_token.get_secret_value() if settings.dispatch_token else None
        if token is None or not tokens_match(
            request.headers.get("authorization", ""), f"Bearer {token}"
        ):
            reason = disabled if token is None else "bad bearer token"
            return await self.reject(request, 401, reason, event, started)
        try:
            return model.model_validate(parse_json(body) if body.strip() or not empty else {})
        except ValueError as exc:  # not JSON, or a field pydantic refused (it says which)
            problem = (
                InvalidPayload.from_validation(exc)
                if isinstance(exc, ValidationError)
                else f"body is not JSON: {exc}"
            )
            status = 422 if isinstance(exc, ValidationError) else 400
            return await self.reject(request, status, str(problem), event, started)

    async def read_within_limit(self, request: Request) -> bytes | None:
        """The body, or None when it is over the limit (counted as it streams in)."""
        try:
            return await read_body_at_most(request, self.rt.settings.max_body_bytes)
        except BodyTooLarge:
            return None


router = APIRouter()  # the webhooks: GitHub's and the CRCR dispatch


def intake_of(request: Request) -> Intake:
    """What ``mount.install`` put on the app, for a route of any intake group."""
    intake: Intake = request.app.state.intake
    return intake


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
    intake = intake_of(request)
    settings = intake.rt.settings
    started = time.perf_counter()
    event = request.headers.get("x-github-event")
    body = await intake.read_within_limit(request)
    if body is None:
        return await intake.reject(request, 413, intake.too_large, event, started)
    secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else None
    signature = request.headers.get("x-hub-signature-256")
    if secret is not None and not verify(secret, body, signature):
        reason = "missing X-Hub-Signature-256" if not signature else "signature mismatch"
        return await intake.reject(request, 401, reason, event, started)
    named = _github_headers(request)
    if isinstance(named, str):
        return await intake.reject(request, 400, named, event, started)
    event, delivery_id, hook_id = named
    try:
        payload = parse_json(body)
    except ValueError as exc:  # bad UTF-8 or syntax, giant ints, nesting, surrogates
        return await intake.reject(request, 400, f"body is not JSON: {exc}", event, started)
    if not isinstance(payload, dict):
        return await intake.reject(request, 400, "body is not a JSON object", event, started)
    headers = {
        k: v
        for k, v in request.headers.items()
        if k.startswith("x-github-") or k in ("user-agent", "content-type")
    }
    if event == "ping":  # recorded (as ignored) and answered 200, as GitHub expects
        try:
            meaning = summarize(event, payload)
        except InvalidPayload as exc:
            return await intake.reject(request, 422, str(exc), event, started)
        await run_in_threadpool(
            intake.store, "github", hook_id, delivery_id, event, body, headers, meaning
        )
        intake.metrics.deliveries.labels("ping", "pong").inc()
        zen = payload.get("zen")
        return JSONResponse(
            {"pong": True, "zen": zen if isinstance(zen, str) else None}, status_code=200
        )
    return await intake.accept(
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
    intake = intake_of(request)
    settings = intake.rt.settings
    started = time.perf_counter()
    body = await intake.read_within_limit(request)
    if body is None:
        return await intake.reject(request, 413, intake.too_large, None, started)
    token = settings.dispatch_token.get_secret_value() if settings.dispatch_token else None
    auth = request.headers.get("authorization", "")
    if token is None or not tokens_match(auth, f"Bearer {token}"):
        reason = "dispatch is disabled (no token set)" if token is None else "bad bearer token"
        return await intake.reject(request, 401, reason, None, started)
    try:
        data = parse_json(body)
    except ValueError as exc:  # bad UTF-8 or syntax, giant ints, nesting, surrogates
        return await intake.reject(request, 400, f"body is not JSON: {exc}", None, started)
    try:
        envelope = DispatchEnvelope.model_validate(
            data.get("client_payload", data) if isinstance(data, dict) else data
        )
    except ValidationError as exc:
        problem = InvalidPayload.from_validation(exc)
        return await intake.reject(request, 422, f"envelope field {problem}", None, started)
    with delivery_context(envelope.delivery_id):
        return await intake.accept(
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


def tokens_match(a: str, b: str) -> bool:
    """Compare a presented secret in constant time."""
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())
