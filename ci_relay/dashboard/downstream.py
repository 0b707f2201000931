"""Other relays' results on the dashboard: HUD bodies posted to ``/api/crcr/results``.

Another downstream relay testing the same upstream commit on its own hardware is one
more column of the grid, so one page answers "what do all backends say about this
commit". A column is named ``verified_repo: workflow / job`` (GitHub's own "workflow /
job" check naming, prefixed by the relay that vouched for it), so two relays' jobs
with the same name never share a column. Rows are matched to commits on the upstream
repository and head sha found in the posted webhook payload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import ColumnElement, func, select, tuple_
from sqlalchemy.orm import Session

from ci_relay.dashboard.status import ordered_counts, workflow_status
from ci_relay.dashboard.views import DownstreamCell, DownstreamFailure, DownstreamRecord
from ci_relay.store.models import CrcrResult

Head = tuple[str, str]  # (upstream repository, head sha)
# what a cell shows, read from the columns (the raw body is parsed only for a record's page)
CELL_COLUMNS = (
    CrcrResult.id,
    CrcrResult.upstream_repo,
    CrcrResult.head_sha,
    CrcrResult.verified_repo,
    CrcrResult.workflow_name,
    CrcrResult.job_name,
    CrcrResult.status,
    CrcrResult.conclusion,
    CrcrResult.summary["test_results"].label("test_results"),
)


def column_name(verified_repo: str, workflow_name: str, job_name: str) -> str:
    """The grid column of one job of one relay, e.g. ``acme/torch-widget: widget-ci / test``."""
    return f"{verified_repo}: {workflow_name} / {job_name}"


def safe_url(value: Any) -> str | None:
    """A link from an untrusted body, only when it is plain http(s) (never ``javascript:``)."""
    if not isinstance(value, str):
        return None
    parts = urlsplit(value)
    return value if parts.scheme in ("http", "https") and parts.netloc else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _counts(test_results: Any) -> tuple[dict[str, int], int | None]:
    if not isinstance(test_results, Mapping):
        return {}, None
    counts = {k: n for k in ("failed", "passed", "skipped") if (n := _int(test_results.get(k)))}
    return ordered_counts(counts), _int(test_results.get("total"))


def _cell(row: Any, records: int) -> DownstreamCell:
    counts, total = _counts(row.test_results)
    return DownstreamCell(
        result_id=row.id,
        column=column_name(row.verified_repo, row.workflow_name, row.job_name),
        verified_repo=row.verified_repo,
        workflow_name=row.workflow_name,
        job_name=row.job_name,
        status=workflow_status(row.status, row.conclusion),
        workflow_status=row.status,
        conclusion=row.conclusion,
        counts=counts,
        total=total,
        records=records,
    )


def _latest(session: Session, *where: ColumnElement[bool]) -> list[tuple[Head, DownstreamCell]]:
    """The newest record of every (commit, relay, workflow, job) matching ``where``."""
    latest = (
        select(func.max(CrcrResult.id).label("id"), func.count(CrcrResult.id).label("records"))
        .where(CrcrResult.upstream_repo.is_not(None), CrcrResult.head_sha.is_not(None), *where)
        .group_by(
            CrcrResult.upstream_repo,
            CrcrResult.head_sha,
            CrcrResult.verified_repo,
            CrcrResult.workflow_name,
            CrcrResult.job_name,
        )
        .subquery()
    )
    rows = session.execute(
        select(*CELL_COLUMNS, latest.c.records)
        .join(latest, CrcrResult.id == latest.c.id)
        .order_by(CrcrResult.verified_repo, CrcrResult.workflow_name, CrcrResult.job_name)
    ).all()
    return [((r.upstream_repo, r.head_sha), _cell(r, r.records)) for r in rows]


def grid_cells(session: Session, heads: list[Head]) -> dict[Head, dict[str, DownstreamCell]]:
    """Other relays' cells of the grid page's commits, in one statement."""
    out: dict[Head, dict[str, DownstreamCell]] = {}
    if heads:
        for head, cell in _latest(
            session, tuple_(CrcrResult.upstream_repo, CrcrResult.head_sha).in_(heads)
        ):
            out.setdefault(head, {})[cell.column] = cell
    return out


def commit_cells(session: Session, sha: ColumnElement[bool]) -> list[DownstreamCell]:
    """Other relays' latest results for a commit (``sha`` is the condition on head_sha)."""
    return [cell for _, cell in _latest(session, sha)]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _failures(workflow: Mapping[str, Any]) -> list[DownstreamFailure]:
    entries = workflow.get("failed_tests")
    return [
        DownstreamFailure(
            name=str(e.get("name", "")),
            file=_text(e.get("file")),
            outcome=_text(e.get("outcome")),
            message=_text(e.get("message")),
            stacktrace=_text(e.get("stacktrace")),
        )
        for e in (entries if isinstance(entries, list) else [])
        if isinstance(e, Mapping)
    ]


def record(session: Session, result_id: int) -> DownstreamRecord | None:
    """One posted result: its columns, and what the raw body says (failed tests, triage)."""
    shown = session.execute(select(*CELL_COLUMNS).where(CrcrResult.id == result_id)).first()
    row = session.get(CrcrResult, result_id)
    if shown is None or row is None:
        return None
    try:
        body: Any = json.loads(row.body)
        callback = body["untrusted"]["callback_payload"]
        workflow = callback["workflow"]
        metrics = body["trusted"].get("ci_metrics") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        workflow, metrics = {}, {}
    if not isinstance(workflow, Mapping):
        workflow = {}
    records = session.scalar(
        select(func.count(CrcrResult.id)).where(
            CrcrResult.upstream_repo == row.upstream_repo,
            CrcrResult.head_sha == row.head_sha,
            CrcrResult.verified_repo == row.verified_repo,
            CrcrResult.workflow_name == row.workflow_name,
            CrcrResult.job_name == row.job_name,
        )
    )
    cell = _cell(shown, int(records or 1))
    triage = workflow.get("triage_verdict")
    return DownstreamRecord(
        cell=cell,
        key="/".join(
            (row.verified_repo, row.delivery_id, row.workflow_name, row.job_name, row.check_run_id)
        ),
        level=row.level,
        event_type=row.event_type,
        delivery_id=row.delivery_id,
        check_run_id=row.check_run_id,
        upstream_repo=row.upstream_repo,
        head_sha=row.head_sha,
        run_attempt=_int(workflow.get("run_attempt")),
        url=safe_url(workflow.get("url")),
        artifact_url=safe_url(workflow.get("artifact_url")),
        started_at=_text(workflow.get("started_at")),
        completed_at=_text(workflow.get("completed_at")),
        queue_time=_number(metrics.get("queue_time") if isinstance(metrics, Mapping) else None),
        execution_time=_number(
            metrics.get("execution_time") if isinstance(metrics, Mapping) else None
        ),
        received_at=row.received_at,
        updated_at=row.updated_at,
        failed_tests=_failures(workflow),
        failed_tests_omitted=_int(workflow.get("failed_tests_omitted")) or 0,
        triage=dict(triage) if isinstance(triage, Mapping) else None,
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
