"""The test page: one test's outcomes across runs, backends and variants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    func,
    select,
)
from sqlalchemy.orm import Session

from ci_relay.dashboard.queries.common import _clamp, _count_of
from ci_relay.dashboard.suggestions import SuggestPolicy, suggest_for_variant
from ci_relay.dashboard.views import (
    HistoryEntry,
    SuggestionView,
    TestHistory,
)
from ci_relay.execution.outcomes import BAD_OUTCOMES
from ci_relay.store.models import (
    Change,
    Run,
    Shard,
    TestResult,
)

SUGGEST_WINDOW = timedelta(days=7)  # the default window of `ci-relay specs suggest`


def history(
    session: Session, nodeid: str, page: int = 1, per_page: int = 50, chart_points: int = 100
) -> TestHistory | None:
    """One test variant's results, newest first, with its flake rate and durations."""
    stats = session.execute(
        select(
            func.count(TestResult.id),
            _count_of(TestResult.outcome == "passed"),
            _count_of(TestResult.outcome.in_(BAD_OUTCOMES)),
            _count_of(TestResult.outcome == "flaky"),
            _count_of(TestResult.outcome == "skipped"),
            func.coalesce(func.avg(TestResult.duration), 0.0),
            func.coalesce(func.max(TestResult.duration), 0.0),
        ).where(TestResult.nodeid == nodeid)
    ).one()
    total = int(stats[0] or 0)
    if not total:
        return None
    pager = _clamp(page, per_page, total)
    joined = (
        select(
            TestResult.id,
            Shard.run_id,
            Run.backend,
            Change.repository,
            Change.head_sha,
            Change.number,
            TestResult.outcome,
            TestResult.mode,
            TestResult.duration,
            TestResult.message,
            Run.created_at,
        )
        .join(Shard, TestResult.shard_id == Shard.id)
        .join(Run, Shard.run_id == Run.id)
        .join(Change, Run.change_id == Change.id)
        .where(TestResult.nodeid == nodeid)
        .order_by(Run.id.desc(), TestResult.id.desc())
    )
    entries = [
        HistoryEntry(
            result_id=r.id,
            run_id=r.run_id,
            backend=r.backend,
            repository=r.repository,
            head_sha=r.head_sha,
            number=r.number,
            outcome=r.outcome,
            mode=r.mode,
            duration=r.duration,
            message=r.message,
            at=r.created_at,
        )
        for r in session.execute(joined.limit(pager.per_page).offset(pager.offset))
    ]
    recent = session.execute(
        select(Shard.run_id, TestResult.duration, TestResult.outcome)
        .join(Shard, TestResult.shard_id == Shard.id)
        .where(TestResult.nodeid == nodeid)
        .order_by(Shard.run_id.desc(), TestResult.id.desc())
        .limit(chart_points)
    ).all()
    return TestHistory(
        nodeid=nodeid,
        total=total,
        passed=int(stats[1]),
        failed=int(stats[2]),
        flaky=int(stats[3]),
        skipped=int(stats[4]),
        mean_duration=float(stats[5]),
        max_duration=float(stats[6]),
        entries=entries,
        pager=pager,
        durations=[(r.run_id, float(r.duration), r.outcome) for r in reversed(recent)],
        suggestions=[
            SuggestionView(backend, found.action, found.reason, found.runs)
            for backend, found in suggest_for_variant(
                session, nodeid, SuggestPolicy(since=datetime.now(UTC) - SUGGEST_WINDOW)
            )
        ],
    )


# --- trends ----------------------------------------------------------------------------------
