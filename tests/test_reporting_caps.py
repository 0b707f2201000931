"""The format's limits as pure functions: text cuts, the triage verdict, Retry-After, levels."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from ci_relay.reporting import levels
from ci_relay.reporting.caps import Budget, ReportTooLarge, clip, clip_chars, fit, triage_verdict
from ci_relay.reporting.transport import retry_after
from ci_relay.reporting.wire import MAX_VERDICT_BYTES, TriageVerdict


def test_clip_cuts_utf8_on_a_character_boundary_and_marks_it() -> None:
    assert clip("short", 1024) == "short"
    cut = clip("é" * 1000, 1024)  # 2,000 bytes
    assert len(cut.encode()) <= 1024 and cut.endswith("…[truncated]")
    cut.encode().decode("utf-8")  # still valid UTF-8
    assert (
        clip_chars("x" * 70_000, 65_535) == "x" * (65_535 - len(" …[truncated]")) + " …[truncated]"
    )


def test_triage_verdict_is_cut_to_the_format() -> None:
    verdict = triage_verdict(
        "backend",
        "medium",
        summary="s" * 5000,
        evidence=[f"{i}:" + "e" * 3000 for i in range(30)],
        analyzer={"name": "triage", "version": "1" * 900, "model": "m", "prompt_version": None},
    )
    data = json.loads(verdict.model_dump_json())
    assert len(data["summary"].encode()) <= 1024
    assert len(data["evidence"]) == 10 and all(len(e.encode()) <= 1024 for e in data["evidence"])
    assert len(json.dumps(data, separators=(",", ":")).encode()) <= MAX_VERDICT_BYTES
    # JSON escaping can still overflow 16 KB: evidence is dropped from the end until it fits
    quoted = triage_verdict(
        "flake", "low", '"' * 1024, ['"' * 1024] * 10, {"name": "a", "version": "1"}
    )
    assert len(quoted.model_dump_json().encode()) <= MAX_VERDICT_BYTES
    assert 0 < len(quoted.evidence) < 10


def test_a_verdict_outside_the_format_is_refused() -> None:
    with pytest.raises(ValidationError):
        TriageVerdict.model_validate(
            {
                "category": "cosmic-rays",
                "confidence": "high",
                "summary": "x",
                "analyzer": {"name": "a", "version": "1"},
            }
        )
    with pytest.raises(ValidationError):
        TriageVerdict.model_validate(
            {
                "category": "flake",
                "confidence": "high",
                "summary": "x",
                "evidence": ["e"] * 11,
                "analyzer": {"name": "a", "version": "1"},
            }
        )


def test_fit_shrinks_until_the_body_fits_or_says_it_cannot() -> None:
    seen: list[Budget] = []

    def render(budget: Budget) -> bytes:
        seen.append(budget)
        return b"x" * (budget.entries * 10 + (5000 if budget.full_payload else 10))

    body, budget = fit(render, 3000)
    assert len(body) <= 3000 and budget.entries < 1000
    assert seen[0] == Budget() and seen[1].stack_bytes < seen[0].stack_bytes
    with pytest.raises(ReportTooLarge):
        fit(lambda b: b"x" * 100, 50)


def test_retry_after_forms() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert retry_after("120", now) == now + timedelta(seconds=120)
    assert retry_after("Wed, 01 Jan 2025 01:00:00 GMT", now) == now + timedelta(hours=1)
    assert retry_after("Tue, 31 Dec 2024 23:00:00 GMT", now) == now  # in the past: now
    assert retry_after("9999999", now) == now + timedelta(days=1)  # capped
    assert retry_after("soon", now) is None and retry_after(None, now) is None


@pytest.mark.parametrize(
    ("level", "conclusion", "check", "status"),
    [
        ("L4", "failure", "failure", "failure"),
        ("L4", "error", "failure", "error"),
        ("L4", "success", "success", "success"),
        ("L3", "failure", "neutral", "success"),
        ("L3", "error", "neutral", "success"),
        ("L3", "success", "success", "success"),
        ("L4", "neutral", "neutral", "success"),
    ],
)
def test_levels_decide_what_github_shows(
    level: str, conclusion: str, check: str, status: str
) -> None:
    assert levels.check_conclusion(level, conclusion) == check
    assert levels.status_state(level, conclusion) == status
