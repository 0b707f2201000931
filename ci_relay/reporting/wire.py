"""Wire formats of the Cross-Repository CI Relay: the callback ``workflow`` and the HUD body.

The same models validate what we send and what other relays send us, so the limits of
the format (entries, bytes) are checked in one place. Unknown keys are kept (``extra``
allowed): other relays may be newer than us.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
    model_validator,
)

SCHEMA_VERSION = "1"
MAX_FAILED_TESTS = 1000
MAX_MESSAGE_BYTES = 1024
MAX_STACKTRACE_BYTES = 4096
MAX_SUMMARY_BYTES = 1024
MAX_EVIDENCE = 10
MAX_EVIDENCE_BYTES = 1024
MAX_VERDICT_BYTES = 16 * 1024
# HUD accepts bodies up to "2 MB": we send at most the smaller reading and accept the larger.
MAX_SEND_BYTES = 2_000_000
MAX_ACCEPT_BYTES = 2 * 1024 * 1024
# strings that become text columns: PostgreSQL's text cannot hold NUL
STORABLE = r"^[^\x00]*$"


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def _at_most(limit: int) -> AfterValidator:
    def check(value: str) -> str:
        if utf8_len(value) > limit:
            raise ValueError(f"longer than {limit} bytes (UTF-8)")
        return value

    return AfterValidator(check)


Message = Annotated[str, _at_most(MAX_MESSAGE_BYTES)]
Stacktrace = Annotated[str, _at_most(MAX_STACKTRACE_BYTES)]
Summary = Annotated[str, _at_most(MAX_SUMMARY_BYTES)]
Evidence = Annotated[str, _at_most(MAX_EVIDENCE_BYTES)]


MAX_NUMERIC_ID = 2**63 - 1  # GitHub's ids are 64-bit


def _whole(value: Any) -> Any:
    """JSON's integers: 7 and 7.0 (JSON Schema counts both), never true or "7"."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WholeNumber = Annotated[int, BeforeValidator(_whole), Strict()]


def _identifier(value: int | str) -> int | str:
    if isinstance(value, int) and not 0 <= value <= MAX_NUMERIC_ID:
        raise ValueError(f"a numeric id is 0 to {MAX_NUMERIC_ID}")
    if isinstance(value, str) and (not 1 <= len(value) <= 64 or "\x00" in value):
        raise ValueError("an id is 1 to 64 characters, no NUL")
    return value


# GitHub ids are numbers; strict: a JSON true is not the id 1
Identifier = Annotated[
    WholeNumber | str,
    AfterValidator(_identifier),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_NUMERIC_ID},
                {"type": "string", "minLength": 1, "maxLength": 64, "pattern": STORABLE},
            ]
        }
    ),
]
Count = Annotated[WholeNumber, Field(ge=0), WithJsonSchema({"type": "integer", "minimum": 0})]


def _iso_text(value: Any) -> Any:
    if not isinstance(value, str | datetime):
        raise ValueError("a timestamp is ISO 8601 text")
    return value


Timestamp = Annotated[datetime, BeforeValidator(_iso_text)]  # not a number of seconds


def compact_json(data: Any) -> bytes:
    """How every report is serialized (and measured against its size limit)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TestCounts(_Open):
    __test__ = False

    passed: Count
    failed: Count
    skipped: Count
    total: Count


class FailedTest(_Open):
    """One failing test as reported; the full list stays in the reporting relay's database."""

    name: str
    file: str | None = None
    outcome: str | None = None
    message: Message | None = None
    stacktrace: Stacktrace | None = None


class Analyzer(_Open):
    name: str
    version: str
    model: str | None = None
    prompt_version: str | None = None


class TriageVerdict(_Open):
    """Advisory: what an analyzer thinks caused the failures. Never changes the conclusion."""

    category: Literal["upstream", "backend", "infra", "flake", "unknown"]
    confidence: Literal["high", "medium", "low"]
    summary: Summary
    # the upstream commit (or PR) the analyzer blames, as test-infra#8673 proposes
    suspected_upstream: str | None = Field(default=None, max_length=128, pattern=STORABLE)
    evidence: list[Evidence] = Field(default_factory=list, max_length=MAX_EVIDENCE)
    analyzer: Analyzer

    @model_validator(mode="after")
    def _fits(self) -> TriageVerdict:
        size = len(compact_json(self.model_dump(mode="json")))
        if size > MAX_VERDICT_BYTES:
            raise ValueError(f"triage_verdict is {size} bytes, over {MAX_VERDICT_BYTES}")
        return self


class Workflow(_Open):
    """The ``workflow`` object of a CRCR callback: one job's status and results."""

    model_config = ConfigDict(
        extra="allow",
        # what _completed_has_a_conclusion checks, for the OpenAPI schema
        json_schema_extra={
            "if": {"properties": {"status": {"const": "completed"}}},
            "then": {
                "required": ["conclusion"],
                "properties": {"conclusion": {"type": "string", "minLength": 1}},
            },
        },
    )

    schema_version: Literal["1"]
    status: Literal["in_progress", "completed"]
    conclusion: str | None = Field(default=None, max_length=32, pattern=STORABLE)
    name: str = Field(min_length=1, max_length=256, pattern=STORABLE)
    url: str | None = None
    run_id: Identifier
    run_attempt: Annotated[
        WholeNumber, Field(ge=1), WithJsonSchema({"type": "integer", "minimum": 1})
    ] = 1
    job_name: str = Field(min_length=1, max_length=256, pattern=STORABLE)
    check_run_id: Identifier
    started_at: Timestamp | None = None
    completed_at: Timestamp | None = None
    test_results: TestCounts | None = None
    artifact_url: str | None = None
    failed_tests: list[FailedTest] = Field(default_factory=list, max_length=MAX_FAILED_TESTS)
    failed_tests_omitted: Count = 0
    triage_verdict: TriageVerdict | None = None

    @model_validator(mode="after")
    def _completed_has_a_conclusion(self) -> Workflow:
        if self.status == "completed" and not self.conclusion:
            raise ValueError("a completed workflow needs a conclusion")
        return self


class CallbackPayload(_Open):
    """What a downstream job sends to the CRCR callback (and HUD keeps as ``untrusted``)."""

    event_type: str = Field(min_length=1, max_length=64, pattern=STORABLE)
    delivery_id: str = Field(min_length=1, max_length=128, pattern=STORABLE)
    payload: dict[str, Any]
    workflow: Workflow


class CiMetrics(_Open):
    queue_time: Annotated[float, Strict()] | None = Field(default=None, ge=0)
    execution_time: Annotated[float, Strict()] | None = Field(default=None, ge=0)


class Trusted(_Open):
    """What the sender vouches for (HUD trusts the relay that authenticated with its token)."""

    verified_repo: str = Field(min_length=3, max_length=256, pattern=r"^[^/\s\x00]+/[^/\s\x00]+$")
    downstream_repo_level: str = Field(min_length=1, max_length=16, pattern=STORABLE)
    ci_metrics: CiMetrics


class Untrusted(_Open):
    callback_payload: CallbackPayload


class HudBody(_Open):
    """``POST .../crcr/results``: a downstream result as PyTorch's HUD ingests it."""

    trusted: Trusted
    untrusted: Untrusted

    def key(self) -> tuple[str, str, str, str, str]:
        """HUD's record key: verified_repo/delivery_id/workflow.name/job_name/check_run_id."""
        callback = self.untrusted.callback_payload
        workflow = callback.workflow
        return (
            self.trusted.verified_repo,
            callback.delivery_id,
            workflow.name,
            workflow.job_name,
            str(workflow.check_run_id),
        )


# What HUD's own handler accepts is looser than what we send: the models below are the
# ingest's reading of a body (``POST /api/crcr/results``), the ones above what we render.


class IngestCounts(TestCounts):
    """HUD adds passed + failed + skipped when ``total`` is absent."""

    total: Count | None = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _total(self) -> IngestCounts:
        if self.total is None:
            self.total = self.passed + self.failed + self.skipped
        return self


class IngestWorkflow(Workflow):
    """Only ``job_name`` and ``check_run_id`` (and the key's ``name``) are required."""

    run_id: Identifier | None = None  # type: ignore[assignment]
    test_results: IngestCounts | None = None

    @model_validator(mode="after")
    def _completed_has_a_conclusion(self) -> IngestWorkflow:
        return self  # HUD keeps a completed result without a conclusion


class IngestCallback(CallbackPayload):
    payload: dict[str, Any] = Field(default_factory=dict)
    workflow: IngestWorkflow


class IngestTrusted(Trusted):
    ci_metrics: CiMetrics = Field(default_factory=lambda: CiMetrics())


class IngestUntrusted(Untrusted):
    callback_payload: IngestCallback


class IngestBody(HudBody):
    """A HUD body as HUD's handler reads it (see DESIGN: the optional fields)."""

    trusted: IngestTrusted
    untrusted: IngestUntrusted
