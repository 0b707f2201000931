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
    ConfigDict,
    Field,
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


def _identifier(value: int | str) -> int | str:
    if not 1 <= len(str(value)) <= 64:
        raise ValueError("an id is 1 to 64 characters")
    return value


Identifier = Annotated[int | str, AfterValidator(_identifier)]  # GitHub ids are numbers


def compact_json(data: Any) -> bytes:
    """How every report is serialized (and measured against its size limit)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TestCounts(_Open):
    __test__ = False

    passed: int = Field(ge=0)
    failed: int = Field(ge=0)
    skipped: int = Field(ge=0)
    total: int = Field(ge=0)


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

    schema_version: Literal["1"]
    status: Literal["in_progress", "completed"]
    conclusion: str | None = Field(default=None, max_length=32)
    name: str = Field(min_length=1, max_length=256)
    url: str | None = None
    run_id: Identifier
    run_attempt: int = Field(default=1, ge=1)
    job_name: str = Field(min_length=1, max_length=256)
    check_run_id: Identifier
    started_at: datetime | None = None
    completed_at: datetime | None = None
    test_results: TestCounts | None = None
    artifact_url: str | None = None
    failed_tests: list[FailedTest] = Field(default_factory=list, max_length=MAX_FAILED_TESTS)
    failed_tests_omitted: int = Field(default=0, ge=0)
    triage_verdict: TriageVerdict | None = None

    @model_validator(mode="after")
    def _completed_has_a_conclusion(self) -> Workflow:
        if self.status == "completed" and not self.conclusion:
            raise ValueError("a completed workflow needs a conclusion")
        return self


class CallbackPayload(_Open):
    """What a downstream job sends to the CRCR callback (and HUD keeps as ``untrusted``)."""

    event_type: str = Field(min_length=1, max_length=64)
    delivery_id: str = Field(min_length=1, max_length=128)
    payload: dict[str, Any]
    workflow: Workflow


class CiMetrics(_Open):
    queue_time: float | None = Field(default=None, ge=0)
    execution_time: float | None = Field(default=None, ge=0)


class Trusted(_Open):
    """What the sender vouches for (HUD trusts the relay that authenticated with its token)."""

    verified_repo: str = Field(min_length=3, max_length=256, pattern=r"^[^/\s]+/[^/\s]+$")
    downstream_repo_level: str = Field(min_length=1, max_length=16)
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
