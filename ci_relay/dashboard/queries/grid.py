"""The grid page: one row per tested upstream head, one cell per backend, newest first."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import (
    Integer,
    Subquery,
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
from ci_relay.dashboard.queries.common import _clamp
from ci_relay.dashboard.queries.upgrades import UPGRADE, recent_upgrades
from ci_relay.dashboard.status import ordered_counts, run_status
from ci_relay.dashboard.views import (
    Cell,
    Grid,
    GridRow,
)
from ci_relay.store.models import (
    Change,
    CrcrResult,
    Run,
    RunState,
    Shard,
    TestResult,
    Triage,
    TriageState,
)


def _seen_heads() -> Subquery:
    """Every commit the grid can show: our changes, and other relays' results (by upstream
    repository and head sha), each with when it was seen."""
    ours = select(
        Change.repository.label("repository"),
        Change.head_sha.label("head_sha"),
        Change.created_at.label("seen"),
        Change.number.label("number"),
        Change.id.label("change_id"),
    ).where(Change.kind != UPGRADE)  # upgrade runs have their own rows (Grid.upgrades)
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
    return Grid(
        backends=backends,
        rows=rows,
        pager=pager,
        downstream=columns,
        upgrades=recent_upgrades(session) if page == 1 else [],
    )


def _latest_cells(
    session: Session, heads: list[tuple[str, str]]
) -> dict[tuple[str, str], dict[str, Cell]]:
    """The latest run per (commit, backend) of the page's commits, in one statement."""
    if not heads:
        return {}
    latest = (
        select(func.max(Run.id).label("run_id"), func.count(Run.id).label("runs"))
        .join(Change, Run.change_id == Change.id)
        .where(tuple_(Change.repository, Change.head_sha).in_(heads), Change.kind != UPGRADE)
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
            Triage.verdict,
            Triage.state.label("triage_state"),
        )
        .join(latest, Run.id == latest.c.run_id)
        .join(Change, Run.change_id == Change.id)
        .outerjoin(Triage, Triage.run_id == Run.id)
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
            triage=_category(r.verdict, r.triage_state),
        )
    return out


def _category(verdict: Any, state: str | None) -> str | None:
    """What a grid cell's triage badge says: the verdict's category, or that it is coming."""
    if state is None:
        return None
    if isinstance(verdict, dict) and isinstance(verdict.get("category"), str):
        return str(verdict["category"])
    return "triaging" if state in (TriageState.PENDING, TriageState.RUNNING) else None


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
