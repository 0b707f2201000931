"""The dashboard's reads: a fixed number of aggregated SQL queries per page, never one per row.

Every function takes a session and returns a view from :mod:`ci_relay.dashboard.views`
(or ``None`` when the thing asked for does not exist); the HTML pages and the JSON
API both call these, so they stay in step. Only the columns a page shows are
selected, which also keeps these reads working while other columns are added.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Subquery,
    case,
    cast,
    desc,
    func,
    null,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.orm import Session

from ci_relay.dashboard import downstream
from ci_relay.dashboard.selection import explain
from ci_relay.dashboard.status import SHOWN_OUTCOMES, ordered_counts, pass_rate, run_status
from ci_relay.dashboard.views import (
    Cell,
    ChangeInfo,
    CommitPage,
    Failure,
    Grid,
    GridRow,
    HeadDetail,
    HistoryEntry,
    Pager,
    PullRequestPage,
    ReportInfo,
    RunInfo,
    RunPage,
    ShardInfo,
    TestHistory,
    TrendPoint,
    Trends,
    from_row,
)
from ci_relay.execution.outcomes import BAD_OUTCOMES
from ci_relay.store.models import (
    Change,
    CrcrResult,
    Delivery,
    OutboxMessage,
    OutboxState,
    Run,
    RunState,
    Selection,
    Shard,
    TestResult,
)

FAILURES_PER_RUN = 200  # a run with more shows the first ones and the total
TITLE_BODY_LIMIT = 2 * 1024 * 1024  # larger bodies are not parsed just for a title
LOG_EXCERPT_LINES = 20
# characters of a failure's text a page shows (head and tail halves); the rest is a link away
DETAILS_SHOWN = 16 * 1024
_OPEN_REPORTS = (OutboxState.PENDING, OutboxState.SENDING)  # a next attempt is coming
_HEX = re.compile(r"^[0-9a-fA-F]{7,64}$")
# where a triage verdict sits in the payloads the relay sends (plain, CRCR callback, HUD body)
_TRIAGE_PATHS: tuple[tuple[str, ...], ...] = (
    ("triage_verdict",),
    ("workflow", "triage_verdict"),
    ("untrusted", "callback_payload", "workflow", "triage_verdict"),
)


def _clamp(page: int, per_page: int, total: int) -> Pager:
    pages = max(1, -(-total // per_page))
    return Pager(min(max(1, page), pages), per_page, total)


# --- grid -----------------------------------------------------------------------------


def _seen_heads() -> Subquery:
    """Every commit the grid can show: our changes, and other relays' results (by upstream
    repository and head sha), each with when it was seen."""
    ours = select(
        Change.repository.label("repository"),
        Change.head_sha.label("head_sha"),
        Change.created_at.label("seen"),
        Change.number.label("number"),
        Change.id.label("change_id"),
    )
    theirs = select(
        CrcrResult.upstream_repo,
        CrcrResult.head_sha,
        CrcrResult.updated_at,
        cast(null(), Integer),
        cast(null(), Integer),
    ).where(CrcrResult.upstream_repo.is_not(None), CrcrResult.head_sha.is_not(None))
    return union_all(ours, theirs).subquery()


def grid(session: Session, page: int = 1, per_page: int = 50) -> Grid:
    """Recent commits (last seen first) × columns: each of our backends' latest run there,
    then each other relay's job's latest posted result."""
    heads = _seen_heads()
    distinct_heads = select(heads.c.repository, heads.c.head_sha).distinct().subquery()
    total = session.scalar(select(func.count()).select_from(distinct_heads)) or 0
    pager = _clamp(page, per_page, total)
    last_seen = func.max(heads.c.seen).label("last_seen")
    found = session.execute(
        select(
            heads.c.repository,
            heads.c.head_sha,
            last_seen,
            func.max(heads.c.number).label("number"),
        )
        .group_by(heads.c.repository, heads.c.head_sha)
        .order_by(desc(last_seen), desc(func.coalesce(func.max(heads.c.change_id), 0)))
        .limit(pager.per_page)
        .offset(pager.offset)
    ).all()
    keys = [(h.repository, h.head_sha) for h in found]
    cells = _latest_cells(session, keys)
    theirs = downstream.grid_cells(session, keys)
    rows = [
        GridRow(
            repository=h.repository,
            head_sha=h.head_sha,
            number=h.number,
            last_seen=h.last_seen,
            cells=cells.get((h.repository, h.head_sha), {}),
            downstream=theirs.get((h.repository, h.head_sha), {}),
        )
        for h in found
    ]
    backends = sorted({b for row in rows for b in row.cells})
    columns = sorted({c for row in rows for c in row.downstream})
    return Grid(backends=backends, rows=rows, pager=pager, downstream=columns)


def _latest_cells(
    session: Session, heads: list[tuple[str, str]]
) -> dict[tuple[str, str], dict[str, Cell]]:
    """The latest run per (commit, backend) of the page's commits, in one statement."""
    if not heads:
        return {}
    latest = (
        select(func.max(Run.id).label("run_id"), func.count(Run.id).label("runs"))
        .join(Change, Run.change_id == Change.id)
        .where(tuple_(Change.repository, Change.head_sha).in_(heads))
        .group_by(Change.repository, Change.head_sha, Run.backend)
        .subquery()
    )
    rows = session.execute(
        select(
            Run.id,
            Run.backend,
            Run.state,
            Run.conclusion,
            Run.counts,
            Run.attempt,
            Change.repository,
            Change.head_sha,
            latest.c.runs,
        )
        .join(latest, Run.id == latest.c.run_id)
        .join(Change, Run.change_id == Change.id)
    ).all()
    live = _live_counts(
        session, [r.id for r in rows if r.state in (RunState.SELECTING, RunState.RUNNING)]
    )
    out: dict[tuple[str, str], dict[str, Cell]] = defaultdict(dict)
    for r in rows:
        out[(r.repository, r.head_sha)][r.backend] = Cell(
            run_id=r.id,
            backend=r.backend,
            status=run_status(r.state, r.conclusion),
            state=r.state,
            conclusion=r.conclusion,
            attempt=r.attempt,
            runs=r.runs,
            counts=ordered_counts(live.get(r.id) or r.counts or {}),
        )
    return out


def _live_counts(session: Session, run_ids: list[int]) -> dict[int, dict[str, int]]:
    """Counts of runs still going (finished runs carry theirs in ``Run.counts``)."""
    if not run_ids:
        return {}
    out: dict[int, dict[str, int]] = defaultdict(dict)
    for run_id, outcome, count in session.execute(
        select(Shard.run_id, TestResult.outcome, func.count())
        .join(TestResult, TestResult.shard_id == Shard.id)
        .where(Shard.run_id.in_(run_ids))
        .group_by(Shard.run_id, TestResult.outcome)
    ):
        out[run_id][outcome] = count
    return out


# --- changes, runs, shards, failures ---------------------------------------------------


def _title(source: str, body: bytes) -> str | None:
    """A PR title or a pushed commit's first line, from the stored raw delivery."""
    if len(body) > TITLE_BODY_LIMIT:
        return None
    try:
        data: Any = json.loads(body)
        if source == "dispatch":
            data = data.get("client_payload", data).get("payload", {})
        pr = data.get("pull_request")
        if isinstance(pr, dict) and pr.get("title"):
            return str(pr["title"])
        commit = data.get("head_commit")
        if isinstance(commit, dict) and commit.get("message"):
            return str(commit["message"]).splitlines()[0]
    except (ValueError, AttributeError):
        pass
    return None


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
        )
        .join(Delivery, Change.delivery_pk == Delivery.id)
        .where(*where)
        .order_by(Change.id)
    ).all()
    return [from_row(ChangeInfo, r, title=_title(r.source, r.body)) for r in rows]


def _runs(session: Session, *where: ColumnElement[bool]) -> list[RunInfo]:
    """Runs with their shards, failures (capped per run) and triage: four queries in all."""
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
    failures, totals = _failures(session, ids, {k: s.log_tail for k, s in shards.items()})
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
            triage=triage.get(r.id, []),
        )
        for r in rows
    ]


def _shards(session: Session, run_ids: list[int]) -> dict[tuple[int, int], ShardInfo]:
    if not run_ids:
        return {}
    rows = session.execute(
        select(
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
        ).where(Shard.run_id.in_(run_ids))
    ).all()
    return {
        (r.run_id, r._mapping["index"]): from_row(ShardInfo, r, tests=int(r.tests or 0))
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
    session: Session, run_ids: list[int], logs: dict[tuple[int, int], str | None]
) -> tuple[dict[int, list[Failure]], dict[int, int]]:
    if not run_ids:
        return {}, {}
    shown = TestResult.outcome.in_(SHOWN_OUTCOMES)
    flaky_last = case((TestResult.outcome == "flaky", 1), else_=0)
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
        .where(Shard.run_id.in_(run_ids), shown)
        .subquery()
    )
    out: dict[int, list[Failure]] = defaultdict(list)
    for r in session.execute(
        select(ranked).where(ranked.c.rank <= FAILURES_PER_RUN).order_by(ranked.c.rank)
    ):
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
    return out, totals


def _triage(session: Session, run_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Advisory triage verdicts found in the run's outgoing reports (newest first, distinct)."""
    if not run_ids:
        return {}
    paths = [OutboxMessage.payload[path] for path in _TRIAGE_PATHS]
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for run_id, *verdicts in session.execute(
        select(OutboxMessage.run_id, *paths)
        .where(OutboxMessage.run_id.in_(run_ids))
        .order_by(OutboxMessage.id.desc())
    ):
        for verdict in verdicts:
            if isinstance(verdict, dict) and verdict not in out[run_id]:
                out[run_id].append(verdict)
    return out


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
) -> RunPage | None:
    """One run: its change, shards, failures and the selection that made it, explained."""
    runs = _runs(session, Run.id == run_id)
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


def _count_of(condition: ColumnElement[bool]) -> Any:
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


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
    )


# --- trends ----------------------------------------------------------------------------------


def _seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    if (start.tzinfo is None) != (end.tzinfo is None):  # SQLite hands back naive UTC
        start, end = start.replace(tzinfo=None), end.replace(tzinfo=None)
    return max(0.0, (end - start).total_seconds())


def trends(session: Session, backend: str | None = None, limit: int = 200) -> Trends:
    """The last ``limit`` finished runs, oldest first: pass rate, selection size, time to signal.

    Time to signal is from the webhook's arrival to the first shard's stored results
    (results are written when a shard finishes). Selected tests are counted from the
    shards (small lists); only the suite size is read out of the stored plan.
    """
    backends = list(
        session.scalars(select(Run.backend).group_by(Run.backend).order_by(Run.backend))
    )
    query = (
        select(
            Run.id,
            Run.backend,
            Run.created_at,
            Run.conclusion,
            Run.counts,
            Change.head_sha,
            Delivery.received_at,
            Selection.plan["universe_size"].as_integer().label("universe"),
        )
        .join(Change, Run.change_id == Change.id)
        .join(Delivery, Change.delivery_pk == Delivery.id)
        .outerjoin(Selection, Selection.run_id == Run.id)
        .where(Run.state.in_((RunState.COMPLETED, RunState.FAILED)))
        .order_by(Run.id.desc())
        .limit(limit)
    )
    if backend:
        query = query.where(Run.backend == backend)
    rows = session.execute(query).all()
    shards = {
        r.run_id: r
        for r in session.execute(
            select(
                Shard.run_id,
                func.min(Shard.finished_at).label("first_result"),
                func.sum(func.json_array_length(Shard.test_files)).label("selected"),
            )
            .where(Shard.run_id.in_([r.id for r in rows]))
            .group_by(Shard.run_id)
        )
    }
    points = []
    for r in reversed(rows):
        shard = shards.get(r.id)
        selected = int(shard.selected or 0) if shard else (0 if r.universe is not None else None)
        points.append(
            TrendPoint(
                run_id=r.id,
                backend=r.backend,
                head_sha=r.head_sha,
                created_at=r.created_at,
                conclusion=r.conclusion,
                pass_rate=pass_rate(r.counts or {}),
                selected=selected,
                universe=r.universe,
                time_to_signal=_seconds_between(
                    r.received_at, shard.first_result if shard else None
                ),
            )
        )
    return Trends(backend=backend, backends=backends, points=points)
