"""The HTTP API as OpenAPI documents it: answer bodies, error shapes, and id parameters.

Routes build their responses by hand (raw bodies must be read before they are parsed,
pages are HTML), so FastAPI cannot infer what they answer. These models and maps say it,
and the schema they produce is what Schemathesis fuzzes the whole API against
(tests/test_api_schema.py): an answer the schema does not describe is a test failure.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from fastapi.security import APIKeyHeader, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

# database ids are 32-bit on PostgreSQL; larger ones name nothing (and must not reach SQL)
MAX_DB_ID = 2**31 - 1
DbId = Annotated[int, Path(ge=1, le=MAX_DB_ID)]
# what text parameters may hold: no control characters (PostgreSQL refuses NUL in text)
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
RepositoryQuery = Annotated[
    str | None,
    Query(
        max_length=140,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$",
        description="owner/name",
    ),
]
CommitPrefix = Annotated[
    str,
    Path(
        min_length=1,
        max_length=128,
        pattern=PRINTABLE,
        description="a commit id or a prefix of one (anything else finds nothing)",
    ),
]
# a page of a run's failures ends at "FLAKY-RESULT_ID" (ci_relay.dashboard.views.FailureCursor)
FAILURES_CURSOR = r"^([01])-([0-9]{1,10})$"
FailuresCursorQuery = Annotated[
    str | None,
    Query(
        max_length=12,
        pattern=FAILURES_CURSOR,
        description="the next page of a run's failures: the `failures_next` of the page before",
    ),
]
BackendQuery = Annotated[
    str | None, Query(max_length=32, pattern=PRINTABLE, description="a backend's name")
]


# Documented as security schemes (the routes check the values themselves, in constant time,
# after the size limit): declared with auto_error off, FastAPI only describes them.
DISPATCH_AUTH = HTTPBearer(
    auto_error=False, scheme_name="dispatch token", description="CI_RELAY_DISPATCH_TOKEN"
)
HUD_AUTH = APIKeyHeader(
    name="x-hud-internal-bot",
    auto_error=False,
    scheme_name="HUD token",
    description="CI_RELAY_HUD_TOKEN, as HUD's own ingestion expects it",
)


class ErrorBody(BaseModel):
    """Why a request was refused (webhooks, dispatch, HUD ingest)."""

    error: str


class Detail(BaseModel):
    """Why a read found nothing (FastAPI's own error shape)."""

    detail: str


class Accepted(BaseModel):
    """A delivery taken (202): stored first, processed by a worker."""

    model_config = ConfigDict(extra="allow")

    id: int | None = Field(default=None, description="the stored delivery's row id")
    delivery_id: str
    state: str = Field(description="received | ignored")
    duplicate: bool = False
    reason: str | None = None


class Pong(BaseModel):
    pong: bool
    zen: str | None = None


class IngestAnswer(BaseModel):
    id: int
    key: str = Field(description="verified_repo/delivery_id/workflow.name/job_name/check_run_id")
    created: bool
    updated: bool


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """Refusals that answer ``{"error": ...}``."""
    why = {
        400: "malformed request: a missing or bad header, a body that is not a JSON object",
        401: "missing or wrong signature or token",
        404: "no such row",
        409: "the row is not in a state that allows it (the message says which)",
        413: "body over the size limit (counted while streaming)",
        422: "a field has the wrong shape; the message names it",
    }
    return {code: {"model": ErrorBody, "description": why[code]} for code in codes}


# a write route with a path parameter: its body's refusals say {"error": ...}, FastAPI's own
# check of the path (a run id that is not a database id) says {"detail": [...]}
INVALID_BODY_OR_PATH: dict[int | str, dict[str, Any]] = {
    422: {
        "description": 'a body field has the wrong shape ({"error"}: the message names it), '
        'or the path parameter is not an id ({"detail"}, FastAPI\'s own)',
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        ErrorBody.model_json_schema(),
                        {"$ref": "#/components/schemas/HTTPValidationError"},
                    ]
                }
            }
        },
    }
}

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {
        "description": "no such row",
        # spelled out: a plain-text route would otherwise document its 404 as text/plain
        "content": {"application/json": {"schema": Detail.model_json_schema()}},
    }
}
HTML_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such row (an HTML page saying so)", "content": {"text/html": {}}}
}
JSON_ANY: dict[int | str, dict[str, Any]] = {
    200: {"description": "the page's data", "content": {"application/json": {"schema": {}}}}
}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its raw body itself (``schema`` is a
    pydantic JSON schema; its ``$defs`` are inlined, OpenAPI has no place for them here)."""
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": inline_refs(schema)}},
        }
    }


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``{"$ref": "#/$defs/X"}`` replaced by X (no recursive models)."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.removeprefix("#/$defs/")])
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    out: dict[str, Any] = walk(schema)
    return out


def header(
    name: str, description: str, required: bool = True, pattern: str | None = None
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": 1 if required else 0}
    if pattern:
        schema["pattern"] = pattern
    return {
        "name": name,
        "in": "header",
        "required": required,
        "description": description,
        "schema": schema,
    }
