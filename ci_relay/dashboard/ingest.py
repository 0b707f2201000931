"""``POST /api/crcr/results``: take HUD-format results from other downstream relays.

Checks in the order that costs least for a bad caller: the ``x-hud-internal-bot`` token
(constant-time; 401), the 2 MiB limit counted on the streamed body (413), JSON and the
HUD schema as HUD's own handler reads it (422 naming the field: ``total``, ``url``,
``run_id``, ``conclusion``, timestamps and ``ci_metrics`` may be absent, ids may be numbers or
text, unknown fields are kept but not read). Accepted bodies are upserted on HUD's key.
``GET /api/crcr/results`` lists them for the dashboard.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Security
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from ci_relay.api_docs import (
    HUD_AUTH,
    NOT_FOUND,
    DbId,
    IngestAnswer,
    RepositoryQuery,
    errors,
    json_body,
)
from ci_relay.audit import AuditLog
from ci_relay.context import RelayContext
from ci_relay.dashboard import results_store
from ci_relay.reporting.hud import TOKEN_HEADER
from ci_relay.reporting.wire import MAX_ACCEPT_BYTES, IngestBody
from ci_relay.request_body import BodyTooLarge, parse_json, read_body_at_most

log = logging.getLogger("ci_relay.dashboard.ingest")
PATH = "/api/crcr/results"


def _field(error: dict[str, Any]) -> str:
    return ".".join(str(part) for part in error["loc"]) or "body"


router = APIRouter()


@dataclass(frozen=True)
class Ingest:
    """What the ingest routes share, kept on ``app.state.ingest`` by :func:`install`."""

    rt: RelayContext
    audit_log: AuditLog


def ingest_of(request: Request) -> Ingest:
    ingest: Ingest = request.app.state.ingest
    return ingest


def install(app: FastAPI, rt: RelayContext, audit_log: AuditLog) -> None:
    """Mount ``POST`` and ``GET /api/crcr/results`` on ``app``."""
    app.state.ingest = Ingest(rt, audit_log)
    app.include_router(router)


def audit(request: Request, status: int, reason: str) -> None:
    remote = request.client.host if request.client else None
    ingest_of(request).audit_log.record(request.url.path, status, reason, remote)


async def reject(request: Request, status: int, reason: str) -> JSONResponse:
    await run_in_threadpool(audit, request, status, reason)
    log.warning("rejected %s: %s (%s)", request.url.path, reason, status)
    return JSONResponse({"error": reason}, status_code=status)


@router.post(
    PATH,
    status_code=201,
    response_model=IngestAnswer,
    responses={
        200: {"model": IngestAnswer, "description": "an existing record updated (or kept)"},
        **errors(401, 413, 422),
    },
    openapi_extra={
        **json_body(IngestBody.model_json_schema(), "a result in HUD's ingestion format"),
    },
    dependencies=[Security(HUD_AUTH)],
)
async def ingest(request: Request) -> JSONResponse:
    rt = ingest_of(request).rt
    expected = rt.settings.hud_token
    given = request.headers.get(TOKEN_HEADER)
    if expected is None:
        return await reject(request, 401, "ingest is disabled (CI_RELAY_HUD_TOKEN not set)")
    if given is None or not hmac.compare_digest(
        given.encode(), expected.get_secret_value().encode()
    ):
        reason = f"missing {TOKEN_HEADER}" if given is None else f"wrong {TOKEN_HEADER}"
        return await reject(request, 401, reason)
    try:
        raw = await read_body_at_most(request, MAX_ACCEPT_BYTES)
    except BodyTooLarge:
        return await reject(
            request, 413, f"body over the HUD limit of {MAX_ACCEPT_BYTES} bytes (2 MiB)"
        )
    try:
        data = parse_json(raw)
    except ValueError as exc:  # bad UTF-8 or syntax, giant ints, nesting, surrogates
        return await reject(request, 422, f"body is not JSON: {exc}")
    try:
        body = IngestBody.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        return await reject(request, 422, f"field {_field(dict(first))}: {first['msg']}")
    stored = await run_in_threadpool(results_store.upsert, rt.db, body, raw)
    key = "/".join(body.key())
    log.info("crcr result %s stored (created=%s)", key, stored.created)
    return JSONResponse(
        {"id": stored.id, "key": key, "created": stored.created, "updated": stored.updated},
        status_code=201 if stored.created else 200,
    )


@router.get(PATH)
async def listing(
    request: Request,
    repo: RepositoryQuery = None,
    limit: int = Query(100, ge=1, le=1000),
) -> list[dict[str, Any]]:
    db = ingest_of(request).rt.db
    return await run_in_threadpool(results_store.listing, db, repo, limit)


@router.get(
    PATH + "/{result_id}/body",
    response_class=Response,
    responses={
        200: {"description": "the body as received", "content": {"application/json": {}}},
        **NOT_FOUND,
    },
)
async def raw_body(request: Request, result_id: DbId) -> Response:
    db = ingest_of(request).rt.db
    body = await run_in_threadpool(results_store.body_of, db, result_id)
    if body is None:
        raise HTTPException(404, f"no result {result_id}")
    return Response(body, media_type="application/json")
