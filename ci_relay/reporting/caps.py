"""Cutting reports down to the format's limits; the full results stay in our database.

Texts are cut on a character boundary and marked, so a reader can tell a cut message
from a short one. When a whole body is still too large, :func:`fit` tries smaller
budgets in a fixed order (stacktraces first, then messages, then entries) until it fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ci_relay.execution.excerpt import head_and_tail
from ci_relay.reporting.wire import (
    MAX_EVIDENCE,
    MAX_EVIDENCE_BYTES,
    MAX_FAILED_TESTS,
    MAX_MESSAGE_BYTES,
    MAX_STACKTRACE_BYTES,
    MAX_SUMMARY_BYTES,
    MAX_VERDICT_BYTES,
    Analyzer,
    FailedTest,
    TriageVerdict,
    compact_json,
)

MARK = " …[truncated]"
MAX_ANALYZER_FIELD_BYTES = 256


class ReportTooLarge(ValueError):
    pass


def clip(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes, marked when it was cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    mark = MARK.encode("utf-8")
    if limit <= len(mark):
        return data[:limit].decode("utf-8", "ignore")
    return data[: limit - len(mark)].decode("utf-8", "ignore") + MARK


def clip_chars(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters (GitHub counts characters), marked when cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(MARK))] + MARK


@dataclass(frozen=True)
class Budget:
    """How much failure detail one rendering of a report may carry."""

    entries: int = MAX_FAILED_TESTS
    message_bytes: int = MAX_MESSAGE_BYTES
    stack_bytes: int = MAX_STACKTRACE_BYTES
    full_payload: bool = True


def budgets() -> Iterator[Budget]:
    """From the format's own caps down to no details at all."""
    yield Budget()
    yield Budget(stack_bytes=1024)
    yield Budget(stack_bytes=0)
    yield Budget(stack_bytes=0, message_bytes=256)
    entries = MAX_FAILED_TESTS // 2
    while entries:
        yield Budget(entries=entries, stack_bytes=0, message_bytes=256)
        entries //= 2
    yield Budget(entries=0, stack_bytes=0, message_bytes=256)
    yield Budget(entries=0, stack_bytes=0, message_bytes=256, full_payload=False)


def fit(render: Callable[[Budget], bytes], limit: int) -> tuple[bytes, Budget]:
    """The first rendering, from the richest budget down, that is at most ``limit`` bytes."""
    smallest = 0
    for budget in budgets():
        body = render(budget)
        if len(body) <= limit:
            return body, budget
        smallest = len(body)
    raise ReportTooLarge(f"report is {smallest} bytes even without details (limit {limit})")


def failed_test(
    nodeid: str, outcome: str, text: str | None, budget: Budget, details: str | None = None
) -> FailedTest:
    """A failing test as reported: the message's first line, and the failure's full text
    (else a multi-line message) as stacktrace, its head and tail kept: a traceback's end
    is the error itself, its start the test's own frame."""
    text = (text or "").strip()
    stack = (details or "").strip() or (text if "\n" in text else "")
    first = text.splitlines()[0] if text else ""
    return FailedTest(
        name=nodeid,
        file=nodeid.split("::", 1)[0] or None,
        outcome=outcome,
        message=clip(first, budget.message_bytes) if first else None,
        stacktrace=head_and_tail(stack, budget.stack_bytes)
        if stack and budget.stack_bytes
        else None,
    )


def triage_verdict(
    category: str,
    confidence: str,
    summary: str,
    evidence: list[str],
    analyzer: dict[str, str | None],
    suspected_upstream: str | None = None,
) -> TriageVerdict:
    """An analyzer's advisory verdict cut to the format: summary 1 KB, 10 evidence items,
    16 KB in all (evidence is dropped from the end while JSON escaping still overflows)."""
    kept = [clip(e, MAX_EVIDENCE_BYTES) for e in evidence[:MAX_EVIDENCE]]
    data = {
        "category": category,
        "confidence": confidence,
        "summary": clip(summary, MAX_SUMMARY_BYTES),
        "suspected_upstream": suspected_upstream[:128] if suspected_upstream else None,
        "analyzer": Analyzer.model_validate(
            {
                k: clip(v, MAX_ANALYZER_FIELD_BYTES) if v is not None else None
                for k, v in analyzer.items()
            }
        ).model_dump(mode="json"),
    }
    while kept and len(compact_json({**data, "evidence": kept})) > MAX_VERDICT_BYTES:
        kept.pop()
    return TriageVerdict.model_validate({**data, "evidence": kept})
