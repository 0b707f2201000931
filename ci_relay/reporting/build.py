"""Rendering a run as the CRCR callback and the HUD body, from the database at send time.

Rendering when sending (not when queueing) keeps the outbox row small and lets an old
row (written before a setting such as the public URL was set) still go out right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ci_relay.execution.outcomes import BAD_OUTCOMES
from ci_relay.reporting.caps import Budget, failed_test, fit
from ci_relay.reporting.names import job_name
from ci_relay.reporting.wire import (
    MAX_FAILED_TESTS,
    SCHEMA_VERSION,
    CallbackPayload,
    HudBody,
    TestCounts,
    TriageVerdict,
    Workflow,
    compact_json,
)
from ci_relay.settings import Settings
from ci_relay.steps import delivery_event
from ci_relay.store.models import Run, Shard, TestResult, Triage, TriageState

PASSED = frozenset({"passed", "xfailed", "xpassed", "flaky"})  # as the spec expects them
SKIPPED = frozenset({"skipped"})
# GitHub Actions conclusions; ours has ``error`` (the shard itself broke) on top
CONCLUSIONS = {"success": "success", "failure": "failure", "error": "failure", "neutral": "neutral"}


def aware(value: datetime | None) -> datetime | None:
    """SQLite hands datetimes back without a zone; every stored time is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Failure:
    """A test that broke the run: its one-line message and its full failure text."""

    nodeid: str
    outcome: str
    text: str | None
    details: str | None = None


def _first_attempt(session: Session, run: Run) -> int:
    """The id of the run a chain of reruns by hand started from (0: ``run`` is not a rerun)."""
    first, seen = run, {run.id}
    while first.rerun_of is not None and first.rerun_of not in seen:
        earlier = session.get(Run, first.rerun_of)
        if earlier is None:
            break
        first = earlier
        seen.add(first.id)
    return first.id if first.id != run.id else 0


@dataclass(frozen=True)
class RunFacts:
    """What a report says about a run, read in one session."""

    run_id: int
    attempt: int
    backend: str
    level: str
    conclusion: str | None
    counts: dict[str, int]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    repository: str
    head_sha: str
    number: int | None
    event_type: str
    delivery_id: str
    upstream_payload: dict[str, Any]
    failures: list[Failure] = field(default_factory=list)
    # why the run or a shard could not test at all (no isolating runtime, missing commit)
    infra_errors: list[str] = field(default_factory=list)
    # what the specs list that this upstream revision lacks (the run went on without it)
    spec_drift: list[str] = field(default_factory=list)
    # triage's advisory verdict on the failures, once it finished (an update after the report)
    verdict: TriageVerdict | None = None
    # the first attempt's run id: a run queued again by hand (``rerun_of``) is the same job's
    # next attempt, as a re-run on GitHub keeps its workflow run id (0: this run is the first)
    first_run_id: int = 0

    @property
    def workflow_run_id(self) -> int:
        return self.first_run_id or self.run_id

    @property
    def failed_total(self) -> int:
        return sum(n for outcome, n in self.counts.items() if outcome in BAD_OUTCOMES)


def load_facts(session: Session, run_id: int, with_failures: bool) -> RunFacts:
    run = session.get(Run, run_id)
    if run is None:
        raise LookupError(f"run {run_id} does not exist")
    change = run.change
    event_type, payload = delivery_event(change.delivery)
    failures: list[Failure] = []
    if with_failures:
        rows = session.execute(
            select(TestResult.nodeid, TestResult.outcome, TestResult.message, TestResult.details)
            .join(Shard, Shard.id == TestResult.shard_id)
            .where(Shard.run_id == run_id, TestResult.outcome.in_(sorted(BAD_OUTCOMES)))
            .order_by(Shard.index, TestResult.id)
            .limit(MAX_FAILED_TESTS)
        )
        failures = [Failure(*row) for row in rows]
    created = aware(run.created_at)
    assert created is not None
    infra = [run.error] if run.error else []
    infra += [f"shard {s.index}: {s.error}" for s in run.shards if s.error]
    plan = run.selection.plan if run.selection is not None else {}
    triage = session.scalar(
        select(Triage).where(
            Triage.run_id == run_id, Triage.state.in_((TriageState.DONE, TriageState.FAILED))
        )
    )
    return RunFacts(
        first_run_id=_first_attempt(session, run),
        run_id=run.id,
        attempt=run.attempt,
        backend=run.backend,
        level=run.level,
        conclusion=run.conclusion,
        counts={str(k): int(v) for k, v in (run.counts or {}).items()},
        created_at=created,
        started_at=aware(run.started_at),
        finished_at=aware(run.finished_at),
        repository=change.repository,
        head_sha=change.head_sha,
        number=change.number,
        event_type=event_type,
        delivery_id=change.delivery.delivery_id,
        upstream_payload=payload,
        failures=failures,
        infra_errors=infra,
        spec_drift=drift_lines(plan.get("spec_drift") if isinstance(plan, dict) else None),
        verdict=TriageVerdict.model_validate(triage.verdict)
        if triage is not None and triage.verdict and with_failures
        else None,
    )


def drift_lines(value: Any) -> list[str]:
    """A stored plan's spec drift as one line each (``spec:line: message; likely ...``)."""
    lines = []
    for item in value if isinstance(value, list) else []:
        if not isinstance(item, dict):
            continue
        hint = f"; likely renamed to {item['likely']!r}" if item.get("likely") else ""
        lines.append(
            f"{item.get('file', '?')}:{item.get('line', '?')}: {item.get('message', '')}{hint}"
        )
    return lines


def counts_of(facts: RunFacts) -> TestCounts:
    c = facts.counts
    return TestCounts(
        passed=sum(n for o, n in c.items() if o in PASSED),
        failed=facts.failed_total,
        skipped=sum(n for o, n in c.items() if o in SKIPPED),
        total=sum(c.values()),
    )


def run_url(settings: Settings, run_id: int) -> str | None:
    return f"{settings.public_url.rstrip('/')}/runs/{run_id}" if settings.public_url else None


def artifact_url(settings: Settings, run_id: int) -> str | None:
    """Where every result of the run is (the report carries at most 1,000 failures)."""
    return f"{settings.public_url.rstrip('/')}/api/runs/{run_id}" if settings.public_url else None


def workflow(
    facts: RunFacts,
    settings: Settings,
    event: str,
    budget: Budget,
    verdict: TriageVerdict | None = None,
) -> Workflow:
    """The callback's ``workflow``. ``check_run_id`` is our run id: stable between the
    in_progress and completed reports, new for each attempt, as on GitHub; ``run_id`` is the
    first attempt's, kept by a run queued again by hand, as a re-run on GitHub keeps it."""
    completed = event == "completed"
    failures = facts.failures[: budget.entries] if completed else []
    return Workflow(
        schema_version=SCHEMA_VERSION,
        status="completed" if completed else "in_progress",
        conclusion=CONCLUSIONS.get(facts.conclusion or "", "failure") if completed else None,
        name=settings.report_name,
        url=run_url(settings, facts.run_id),
        run_id=facts.workflow_run_id,
        run_attempt=facts.attempt,
        job_name=job_name(facts.backend),
        check_run_id=facts.run_id,
        started_at=facts.started_at or facts.created_at,
        completed_at=(facts.finished_at or facts.started_at or facts.created_at)
        if completed
        else None,
        test_results=counts_of(facts) if completed else None,
        artifact_url=artifact_url(settings, facts.run_id),
        failed_tests=[
            failed_test("(infrastructure)", "error", text, budget).model_copy(update={"file": None})
            for text in (facts.infra_errors if completed else [])
        ]
        + [failed_test(f.nodeid, f.outcome, f.text, budget, f.details) for f in failures],
        failed_tests_omitted=max(0, facts.failed_total - len(failures)) if completed else 0,
        triage_verdict=verdict,
    )


def payload_summary(facts: RunFacts) -> dict[str, Any]:
    """What is left of the upstream webhook when the report must shrink: who and which commit."""
    summary: dict[str, Any] = {
        "repository": {"full_name": facts.repository},
        "after": facts.head_sha,
        "truncated": True,
    }
    if facts.number is not None:
        summary["number"] = facts.number
        summary["pull_request"] = {"number": facts.number, "head": {"sha": facts.head_sha}}
    return summary


def callback_payload(
    facts: RunFacts, settings: Settings, event: str, budget: Budget
) -> CallbackPayload:
    return CallbackPayload(
        event_type=facts.event_type,
        delivery_id=facts.delivery_id,
        payload=facts.upstream_payload if budget.full_payload else payload_summary(facts),
        workflow=workflow(
            facts, settings, event, budget, facts.verdict if event == "completed" else None
        ),
    )


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def hud_body(facts: RunFacts, settings: Settings, event: str, budget: Budget) -> HudBody:
    if not settings.downstream_repo:
        raise ValueError("CI_RELAY_DOWNSTREAM_REPO is not set (HUD's verified_repo)")
    return HudBody.model_validate(
        {
            "trusted": {
                "verified_repo": settings.downstream_repo,
                "downstream_repo_level": facts.level,
                "ci_metrics": {
                    "queue_time": _seconds(facts.created_at, facts.started_at),
                    "execution_time": _seconds(facts.started_at, facts.finished_at),
                },
            },
            "untrusted": {
                "callback_payload": callback_payload(facts, settings, event, budget).model_dump(
                    mode="json"
                )
            },
        }
    )


def render_callback(facts: RunFacts, settings: Settings, event: str, limit: int) -> bytes:
    body, _ = fit(
        lambda b: compact_json(callback_payload(facts, settings, event, b).model_dump(mode="json")),
        limit,
    )
    return body


def render_hud(facts: RunFacts, settings: Settings, event: str, limit: int) -> bytes:
    body, _ = fit(
        lambda b: compact_json(hud_body(facts, settings, event, b).model_dump(mode="json")),
        limit,
    )
    return body
