"""``POST /api/runs/{id}/rerun``: recover a run that failed or errored, behind the dispatch
token, without re-sending anything upstream.

The new run is the next attempt of the same change on the same backend, linked to the run it
recovers; it runs that run's stored plan again (or only its failed shards) instead of
selecting anew, so what it reports is the same job's next attempt (GitHub check, HUD, CRCR
all carry the attempt number). A run that never got a plan (its selection failed) is
selected again. One rerun at a time: a run already queued again is not queued twice.
"""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Request, Security
from fastapi.responses import JSONResponse
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from ci_relay.api_docs import DISPATCH_AUTH, INVALID_BODY_OR_PATH, DbId, errors, json_body
from ci_relay.intake.routes import intake_of
from ci_relay.intake.wire import RerunAccepted, RerunRequest
from ci_relay.steps import Next
from ci_relay.store.models import Change, Run, RunState, ShardState, recoverable

log = logging.getLogger("ci_relay.intake")

router = APIRouter()

UNFINISHED = (RunState.PENDING, RunState.SELECTING, RunState.RUNNING)
ALL, FAILED = "all", "failed"


class RerunRefused(Exception):
    """Why a run cannot be queued again, with the HTTP status that says so."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def failed_shards(run: Run) -> list[int]:
    """The indexes of a run's shards that did not pass: failed to run, or ended non-zero."""
    return [s.index for s in run.shards if s.state == ShardState.FAILED or (s.exit_code or 0) != 0]


def queue_rerun(session: Session, run_id: int, failed_only: bool) -> Run:
    """The new attempt recovering run ``run_id`` (added and flushed), or RerunRefused."""
    run = session.get(Run, run_id)
    if run is None:
        raise RerunRefused(404, f"no run {run_id}")
    if run.state in UNFINISHED:
        raise RerunRefused(
            409, f"run {run_id} is {run.state}: a run is queued again once it has finished"
        )
    if not recoverable(run.state, run.conclusion):
        raise RerunRefused(409, f"run {run_id} passed ({run.conclusion}): nothing to recover")
    pending = session.scalars(
        select(Run).where(Run.rerun_of == run_id, Run.state.in_(UNFINISHED))
    ).first()
    if pending is not None:
        raise RerunRefused(
            409,
            f"run {run_id} is already queued again as run {pending.id} (attempt "
            f"{pending.attempt}, {pending.state})",
        )
    if failed_only and not failed_shards(run):
        raise RerunRefused(
            409,
            f"run {run_id} has no failed shard to run again (it ended before its tests ran): "
            "queue it again whole",
        )
    change = run.change
    latest = session.scalar(
        select(func.max(Run.attempt))
        .join(Change)
        .where(
            Change.repository == change.repository,
            Change.head_sha == change.head_sha,
            Run.backend == run.backend,
        )
    )
    again = Run(
        change=change,
        backend=run.backend,
        attempt=(latest or run.attempt) + 1,
        level=run.level,
        rerun_of=run.id,
        rerun_scope=FAILED if failed_only else ALL,
    )
    session.add(again)
    try:
        session.flush()
    except IntegrityError:  # another request took this attempt number first
        session.rollback()
        raise RerunRefused(
            409, f"run {run_id} was queued again by another request at the same moment"
        ) from None
    return again


@router.post(
    "/api/runs/{run_id}/rerun",
    status_code=202,
    response_model=RerunAccepted,
    responses={**errors(400, 401, 404, 409, 413), **INVALID_BODY_OR_PATH},
    openapi_extra=json_body(RerunRequest.model_json_schema(), "what to run again (optional)"),
    dependencies=[Security(DISPATCH_AUTH)],
)
async def rerun(request: Request, run_id: DbId) -> JSONResponse:
    """Queue a finished run that failed or errored again as the next attempt of the same
    change and backend, with the same plan (``failed_only``: its failed shards only)."""
    intake = intake_of(request)
    started = time.perf_counter()
    wanted = await intake.guarded_body(
        request, RerunRequest, "rerun", "reruns are disabled (no token set)", started, empty=True
    )
    if isinstance(wanted, JSONResponse):
        return wanted

    def create() -> tuple[int, int, str]:
        with intake.rt.db.session() as session:
            again = queue_rerun(session, run_id, wanted.failed_only)
            return again.id, again.attempt, again.rerun_scope or ALL

    try:
        new_id, attempt, scope = await run_in_threadpool(create)
    except RerunRefused as refused:
        return await intake.reject(request, refused.status, refused.reason, "rerun", started)
    await run_in_threadpool(intake.enqueue, [Next("select", new_id)])
    log.info("run %s queued again as run %s (attempt %s, %s)", run_id, new_id, attempt, scope)
    return JSONResponse(
        {
            "id": new_id,
            "attempt": attempt,
            "rerun_of": run_id,
            "scope": scope,
            "url": f"/runs/{new_id}",
            "state": "pending",
        },
        status_code=202,
    )
