"""Commit, pull request and run pages: changes, runs with their shards, failures (capped
per run), triage and reports, in a fixed number of queries whatever the size."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    case,
    func,
    null,
    or_,
    select,
)
from sqlalchemy.orm import Session

from ci_relay.dashboard import downstream
from ci_relay.dashboard.queries.common import (
    _HEX,
    _OPEN_REPORTS,
    DETAILS_SHOWN,
    FAILURES_PER_RUN,
    LOG_EXCERPT_LINES,
    _title,
)
from ci_relay.dashboard.queries.grid import _live_counts
from ci_relay.dashboard.selection import explain
from ci_relay.dashboard.status import SHOWN_OUTCOMES, ordered_counts, run_status
from ci_relay.dashboard.views import (
    ChangeInfo,
    CommitPage,
    Failure,
    FailureCursor,
    HeadDetail,
    PullRequestPage,
    ReportInfo,
    RunInfo,
    RunPage,
    ShardInfo,
    from_row,
)
from ci_relay.store.models import (
    Change,
    CrcrResult,
    Delivery,
    OutboxMessage,
    Run,
    RunState,
    Selection,
    Shard,
    TestResult,
    Triage,
)


def _changes(session: Session, *where: ColumnElement[bool]) -> list[ChangeInfo]:
    rows = session.execute(
        select(
            Change.id,
            Change.repository,
            Change.kind,
            Change.number,
            Change.ref,
            Change.base_sha,
            Change.head_sha,
            Delivery.event,
            Delivery.action,
            Delivery.delivery_id,
            Delivery.received_at,
            Delivery.source,
            Delivery.body,
            Change.skipped,
        )
        .join(Delivery, Change.delivery_pk == Delivery.id)
        .where(*where)
        .order_by(Change.id)
    ).all()
    return [
        from_row(ChangeInfo, r, title=_title(r.source, r.body), skipped=_skipped(r.skipped))
        for r in rows
    ]


def _skipped(value: Any) -> tuple[dict[str, str], ...]:
    """A change's skipped backends as stored (anything else: none)."""
    if not isinstance(value, list):
        return ()
    return tuple(
        {"backend": str(s.get("backend", "")), "reason": str(s.get("reason", ""))}
        for s in value
        if isinstance(s, dict)
    )


def _runs(
    session: Session, *where: ColumnElement[bool], failures_after: FailureCursor | None = None
) -> list[RunInfo]:
    """Runs with their shards, failures (a page per run, after the cursor) and triage: four
    queries in all."""
    rows = session.execute(
        select(
            Run.id,
            Run.change_id,
            Run.backend,
            Run.attempt,
            Run.level,
            Run.state,
            Run.conclusion,
            Run.counts,
            Run.created_at,
            Run.started_at,
            Run.finished_at,
            Run.rerun_of,
            Run.rerun_scope,
            Change.repository,
            Change.head_sha,
            Change.number,
        )
        .join(Change, Run.change_id == Change.id)
        .where(*where)
        .order_by(Run.id)
    ).all()
    ids = [r.id for r in rows]
    shards = _shards(session, ids)
    failures, totals, following = _failures(
        session, ids, {k: s.log_tail for k, s in shards.items()}, failures_after
    )
    triage = _triage(session, ids)
    live = _live_counts(
        session, [r.id for r in rows if r.state in (RunState.SELECTING, RunState.RUNNING)]
    )
    return [
        from_row(
            RunInfo,
            r,
            status=run_status(r.state, r.conclusion),
            counts=ordered_counts(live.get(r.id) or r.counts or {}),
            shards=[s for (run_id, _), s in sorted(shards.items()) if run_id == r.id],
            failures=failures.get(r.id, []),
            failures_total=totals.get(r.id, 0),
            failures_after=failures_after.token if failures_after else None,
            failures_next=following.get(r.id),
            triage=[triage[r.id].verdict] if r.id in triage and triage[r.id].verdict else [],
            triage_state=triage[r.id].state if r.id in triage else None,
            triage_tests=list(triage[r.id].tests) if r.id in triage else [],
            triage_seconds=triage[r.id].device_seconds if r.id in triage else 0.0,
        )
        for r in rows
    ]


def _shards(session: Session, run_ids: list[int]) -> dict[tuple[int, int], ShardInfo]:
    if not run_ids:
        return {}
    rows = session.execute(
        select(
            Shard.id,
            Shard.run_id,
            Shard.index,
            Shard.state,
            Shard.exit_code,
            Shard.attempts,
            func.json_array_length(Shard.test_files).label("tests"),
            Shard.started_at,
            Shard.finished_at,
            Shard.log_tail,
            Shard.runtime,
            Shard.error,
            Shard.coverage_note,
        ).where(Shard.run_id.in_(run_ids))
    ).all()
    stored = {
        shard_id: (int(n), int(noted or 0))
        for shard_id, n, noted in session.execute(
            select(TestResult.shard_id, func.count(), func.count(TestResult.note))
            .join(Shard, TestResult.shard_id == Shard.id)
            .where(Shard.run_id.in_(run_ids))
            .group_by(TestResult.shard_id)
        ).all()
    }
    return {
        (r.run_id, r._mapping["index"]): from_row(
            ShardInfo,
            r,
            tests=int(r.tests or 0),
            results=stored.get(r.id, (0, 0))[0],
            cpu_only=stored.get(r.id, (0, 0))[1],
        )
        for r in rows
    }


def _excerpt(log_tail: str | None, nodeid: str) -> list[str]:
    if not log_tail:
        return []
    return [line for line in log_tail.splitlines() if nodeid in line][:LOG_EXCERPT_LINES]


def _details(head: str | None, tail: str | None, length: int | None) -> str | None:
    """A failure's text as a page shows it: whole, or its two ends around the cut."""
    if not head:
        return None
    if tail is None:
        return head
    cut = int(length or 0) - len(head) - len(tail)
    return f"{head}\n…[{cut} characters cut: the whole text is behind the link]…\n{tail}"


def _failures(
    session: Session,
    run_ids: list[int],
    logs: dict[tuple[int, int], str | None],
    after: FailureCursor | None = None,
) -> tuple[dict[int, list[Failure]], dict[int, int], dict[int, str]]:
    """A page of each run's failures (flaky ones last, then in storage order), after the
    cursor when given; each run's total; and the cursor of its next page where there is one."""
    if not run_ids:
        return {}, {}, {}
    shown = TestResult.outcome.in_(SHOWN_OUTCOMES)
    flaky_last = case((TestResult.outcome == "flaky", 1), else_=0)
    page: list[ColumnElement[bool]] = [Shard.run_id.in_(run_ids), shown]
    if after is not None:
        page.append(
            or_(
                flaky_last > after.flaky,
                and_(flaky_last == after.flaky, TestResult.id > after.result_id),
            )
        )
    length = func.coalesce(func.length(TestResult.details), 0)
    half = DETAILS_SHOWN // 2
    short = length <= DETAILS_SHOWN
    ranked = (
        select(
            TestResult.id,
            Shard.run_id,
            Shard.index.label("shard_index"),
            TestResult.nodeid,
            TestResult.outcome,
            TestResult.mode,
            TestResult.duration,
            TestResult.message,
            length.label("details_length"),
            case((short, TestResult.details), else_=func.substr(TestResult.details, 1, half)).label(
                "details_head"
            ),
            case((short, null()), else_=func.substr(TestResult.details, length - half + 1)).label(
                "details_tail"
            ),
            func.row_number()
            .over(partition_by=Shard.run_id, order_by=(flaky_last, TestResult.id))
            .label("rank"),
        )
        .join(Shard, TestResult.shard_id == Shard.id)
        .where(*page)
        .subquery()
    )
    out: dict[int, list[Failure]] = defaultdict(list)
    following: dict[int, str] = {}
    # one row past the page says whether a next page exists
    for r in session.execute(
        select(ranked).where(ranked.c.rank <= FAILURES_PER_RUN + 1).order_by(ranked.c.rank)
    ):
        if r.rank > FAILURES_PER_RUN:
            last = out[r.run_id][-1]
            following[r.run_id] = FailureCursor(int(last.flaky), last.result_id).token
            continue
        out[r.run_id].append(
            Failure(
                result_id=r.id,
                run_id=r.run_id,
                shard_index=r.shard_index,
                nodeid=r.nodeid,
                outcome=r.outcome,
                mode=r.mode,
                duration=r.duration,
                message=r.message,
                details=_details(r.details_head, r.details_tail, r.details_length),
                details_length=int(r.details_length or 0),
                details_cut=r.details_tail is not None,
                log_excerpt=_excerpt(logs.get((r.run_id, r.shard_index)), r.nodeid),
            )
        )
    totals = {
        key: value
        for key, value in session.execute(
            select(Shard.run_id, func.count())
            .join(TestResult, TestResult.shard_id == Shard.id)
            .where(Shard.run_id.in_(run_ids), shown)
            .group_by(Shard.run_id)
        )
    }
    return out, totals, following


def _triage(session: Session, run_ids: list[int]) -> dict[int, Triage]:
    """Each run's triage (its verdict, a verdict per test, its state), in one query."""
    if not run_ids:
        return {}
    return {t.run_id: t for t in session.scalars(select(Triage).where(Triage.run_id.in_(run_ids)))}


def _heads(changes: list[ChangeInfo], runs: list[RunInfo]) -> list[HeadDetail]:
    """Group changes and runs by (repository, head sha), newest head first."""
    by_head: dict[tuple[str, str], list[ChangeInfo]] = defaultdict(list)
    for change in changes:
        by_head[(change.repository, change.head_sha)].append(change)
    runs_by_change: dict[int, list[RunInfo]] = defaultdict(list)
    for run in runs:
        runs_by_change[run.change_id].append(run)
    heads = [
        HeadDetail(
            repository=repo,
            head_sha=sha,
            changes=items,
            runs=[run for c in items for run in runs_by_change[c.id]],
        )
        for (repo, sha), items in by_head.items()
    ]
    return sorted(heads, key=lambda h: -max(c.id for c in h.changes))


def _detail(session: Session, *where: ColumnElement[bool]) -> list[HeadDetail]:
    changes = _changes(session, *where)
    if not changes:
        return []
    runs = _runs(session, Run.change_id.in_([c.id for c in changes]))
    return _heads(changes, runs)


def commit_page(session: Session, sha: str) -> CommitPage | None:
    """Every change, run, shard and failure of one upstream commit (full sha or a prefix)."""
    heads = _detail(session, Change.head_sha == sha)
    theirs = downstream.commit_cells(session, CrcrResult.head_sha == sha)
    if not heads and not theirs and _HEX.match(sha):  # hex only: no LIKE wildcards get in
        heads = _detail(session, Change.head_sha.like(f"{sha.lower()}%"))
        theirs = downstream.commit_cells(session, CrcrResult.head_sha.like(f"{sha.lower()}%"))
    if not heads and not theirs:
        return None
    return CommitPage(sha=sha, heads=heads, downstream=theirs)


def pull_request_page(
    session: Session, number: int, repository: str | None = None
) -> PullRequestPage | None:
    """Every head pushed to a pull request, newest first, with all their runs."""
    where = [Change.number == number]
    if repository:
        where.append(Change.repository == repository)
    heads = _detail(session, *where)
    if not heads:
        return None
    latest = max((c for h in heads for c in h.changes), key=lambda c: c.id)
    return PullRequestPage(number=number, repository=repository, title=latest.title, heads=heads)


def run_page(
    session: Session,
    run_id: int,
    selected_page: int = 1,
    excluded_page: int = 1,
    per_page: int = 100,
    failures_after: FailureCursor | None = None,
) -> RunPage | None:
    """One run: its change, shards, a page of its failures (after the cursor) and the
    selection that made it, explained."""
    runs = _runs(session, Run.id == run_id, failures_after=failures_after)
    if not runs:
        return None
    run = runs[0]
    stored = session.execute(
        select(Selection.strategy, Selection.plan).where(Selection.run_id == run_id)
    ).first()
    selection = None
    if stored is not None:
        outcomes = {
            key: value
            for key, value in session.execute(
                select(TestResult.nodeid, TestResult.outcome)
                .join(Shard, TestResult.shard_id == Shard.id)
                .where(Shard.run_id == run_id)
            )
        }
        plan = stored.plan if isinstance(stored.plan, dict) else {}
        selection = explain(stored.strategy, plan, outcomes, selected_page, excluded_page, per_page)
        estimated = _estimated_shard_seconds(plan)
        run = replace(
            run,
            shards=[replace(s, estimated_seconds=estimated.get(s.index)) for s in run.shards],
        )
    changes = _changes(session, Change.id == run.change_id)
    return RunPage(run=run, changes=changes, selection=selection, reports=_reports(session, run_id))


def _estimated_shard_seconds(plan: dict[str, Any]) -> dict[int, float]:
    """Seconds the plan expected per shard: the durations it planned with, summed."""
    out: dict[int, float] = {}
    for item in plan.get("selected") or []:
        if isinstance(item, dict) and isinstance(item.get("shard"), int):
            duration = item.get("duration")
            if isinstance(duration, int | float):
                out[item["shard"]] = out.get(item["shard"], 0.0) + float(duration)
    return out


def _reports(session: Session, run_id: int) -> list[ReportInfo]:
    """The run's outbox rows, oldest first: a report stuck retrying shows why and when next."""
    rows = session.execute(
        select(
            OutboxMessage.id,
            OutboxMessage.target,
            OutboxMessage.payload["event"].as_string().label("event"),
            OutboxMessage.state,
            OutboxMessage.attempts,
            OutboxMessage.next_attempt_at,
            OutboxMessage.last_error,
            OutboxMessage.created_at,
            OutboxMessage.sent_at,
        )
        .where(OutboxMessage.run_id == run_id)
        .order_by(OutboxMessage.id)
    ).all()
    return [
        from_row(
            ReportInfo,
            r,
            next_attempt_at=r.next_attempt_at if r.state in _OPEN_REPORTS else None,
        )
        for r in rows
    ]


def result_details(session: Session, result_id: int) -> str | None:
    """One result's whole failure text (the page shows long ones cut)."""
    return session.scalar(select(TestResult.details).where(TestResult.id == result_id))


# --- one test across commits -------------------------------------------------------------
