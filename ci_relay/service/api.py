"""Read side of the relay: JSON listings, run details, health and metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from ci_relay.api_docs import NOT_FOUND, DbId
from ci_relay.context import RelayContext
from ci_relay.dashboard.queries.health import STATES, health
from ci_relay.metrics import Metrics
from ci_relay.store.database import ping
from ci_relay.store.models import (
    Change,
    Delivery,
    DeliveryState,
    OutboxMessage,
    OutboxState,
    Run,
    Shard,
    ShardState,
    TestResult,
)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def delivery_json(d: Delivery) -> dict[str, Any]:
    return {
        "id": d.id,
        "delivery_id": d.delivery_id,
        "hook_id": d.hook_id,
        "source": d.source,
        "event": d.event,
        "action": d.action,
        "repository": d.repository,
        "head_sha": d.head_sha,
        "state": d.state,
        "reason": d.reason,
        "received_at": _iso(d.received_at),
    }


def run_json(run: Run, with_results: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": run.id,
        "change_id": run.change_id,
        "backend": run.backend,
        "attempt": run.attempt,
        "rerun_of": run.rerun_of,
        "rerun_scope": run.rerun_scope,
        "level": run.level,
        "state": run.state,
        "conclusion": run.conclusion,
        "counts": run.counts,
        "created_at": _iso(run.created_at),
        "finished_at": _iso(run.finished_at),
    }
    if with_results:
        data["selection"] = run.selection.plan if run.selection else None
        data["shards"] = [
            {
                "index": s.index,
                "state": s.state,
                "exit_code": s.exit_code,
                "attempts": s.attempts,
                "runtime": s.runtime,
                "isolated": None if s.runtime is None else s.runtime != "local",
                "error": s.error,
                "started_at": _iso(s.started_at),
                "finished_at": _iso(s.finished_at),
                "results": [
                    {
                        "nodeid": r.nodeid,
                        "outcome": r.outcome,
                        "mode": r.mode,
                        "duration": r.duration,
                        "message": r.message,
                        "details": r.details,
                        "note": r.note,
                    }
                    for r in s.results
                ],
            }
            for s in run.shards
        ]
    return data


def change_json(c: Change) -> dict[str, Any]:
    return {
        "id": c.id,
        "delivery_id": c.delivery.delivery_id,
        "event": c.delivery.event,
        "action": c.delivery.action,
        "repository": c.repository,
        "kind": c.kind,
        "number": c.number,
        "head_sha": c.head_sha,
        "base_sha": c.base_sha,
        "state": _change_state(c),
        "runs": [run_json(r) for r in c.runs],
        "skipped": list(c.skipped or []),
        "created_at": _iso(c.created_at),
    }


def _change_state(c: Change) -> str:
    if not c.runs:
        return "recorded"
    states = {r.state for r in c.runs}
    return "completed" if states <= {"completed", "failed"} else "running"


READY = {
    "application/json": {"schema": {"type": "object", "additionalProperties": {"type": "string"}}}
}


router = APIRouter()


@dataclass(frozen=True)
class Api:
    """What the read API's routes share, kept on ``app.state.api`` by :func:`install`."""

    rt: RelayContext
    metrics: Metrics
    broker_ok: Callable[[], bool]


def api_of(request: Request) -> Api:
    api: Api = request.app.state.api
    return api


def install(
    app: FastAPI, rt: RelayContext, metrics: Metrics, broker_ok: Callable[[], bool]
) -> None:
    """Mount the read API (listings, a run, health, readiness, metrics) on ``app``."""
    app.state.api = Api(rt, metrics, broker_ok)
    app.include_router(router)


def _listing(api: Api, kind: str, limit: int) -> list[dict[str, Any]]:
    with api.rt.db.session() as session:
        if kind == "deliveries":
            rows = session.scalars(select(Delivery).order_by(Delivery.id.desc()).limit(limit))
            return [delivery_json(d) for d in rows]
        changes = session.scalars(select(Change).order_by(Change.id.desc()).limit(limit))
        return [change_json(c) for c in changes]


@router.get("/api/deliveries")
async def deliveries(
    request: Request, limit: int = Query(100, ge=1, le=1000)
) -> list[dict[str, Any]]:
    return await run_in_threadpool(_listing, api_of(request), "deliveries", limit)


@router.get("/api/changes")
async def changes(request: Request, limit: int = Query(100, ge=1, le=1000)) -> list[dict[str, Any]]:
    return await run_in_threadpool(_listing, api_of(request), "changes", limit)


def _run(api: Api, run_id: int) -> dict[str, Any] | None:
    with api.rt.db.session() as session:
        run = session.get(Run, run_id)
        return run_json(run, with_results=True) if run else None


@router.get("/api/runs/{run_id}", responses=NOT_FOUND)
async def run_detail(request: Request, run_id: DbId) -> dict[str, Any]:
    data = await run_in_threadpool(_run, api_of(request), run_id)
    if data is None:
        raise HTTPException(404, f"no run {run_id}")
    return data


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        200: {"description": "database and broker reachable", "content": READY},
        503: {"description": "one of them is not (which one, and why)", "content": READY},
    },
)
async def readyz(request: Request) -> JSONResponse:
    api = api_of(request)
    checks: dict[str, str] = {}
    try:
        await run_in_threadpool(ping, api.rt.db.engine)
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    checks["broker"] = "ok" if await run_in_threadpool(api.broker_ok) else "unreachable"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(checks, status_code=200 if ready else 503)


def _refresh_gauges(api: Api) -> None:
    metrics = api.metrics
    with api.rt.db.session() as session:
        metrics.pending.labels("deliveries").set(
            session.scalar(select(func.count()).where(Delivery.state == DeliveryState.RECEIVED))
            or 0
        )
        metrics.pending.labels("shards").set(
            session.scalar(
                select(func.count()).where(
                    Shard.state.in_([ShardState.PENDING, ShardState.RUNNING])
                )
            )
            or 0
        )
        metrics.pending.labels("reports").set(
            session.scalar(
                select(func.count()).where(
                    OutboxMessage.state.in_([OutboxState.PENDING, OutboxState.SENDING])
                )
            )
            or 0
        )
        for state, count in session.execute(select(Run.state, func.count()).group_by(Run.state)):
            metrics.runs.labels(state).set(count)
        for outcome, count in session.execute(
            select(TestResult.outcome, func.count()).group_by(TestResult.outcome)
        ):
            metrics.tests.labels(outcome).set(count)
        readiness = health(session, api.rt.settings.health_window_days)
    for backend in readiness.backends:
        for figure in backend.figures:
            metrics.promotion_threshold.labels(figure.key).set(figure.threshold)
            if figure.value is not None:
                metrics.promotion.labels(backend.backend, figure.key).set(figure.value)
            if figure.met is not None:
                metrics.promotion_met.labels(backend.backend, figure.key).set(int(figure.met))
        for figure in backend.demotion_figures:
            if figure.value is not None:
                metrics.demotion.labels(backend.backend, figure.key).set(figure.value)
            if figure.met is not None:
                metrics.demotion_met.labels(backend.backend, figure.key).set(int(figure.met))
        for state in STATES:
            metrics.readiness.labels(backend.backend, state).set(int(state == backend.state))


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"description": "Prometheus text format", "content": {"text/plain": {}}}},
)
async def prometheus(request: Request) -> Response:
    api = api_of(request)
    await run_in_threadpool(_refresh_gauges, api)
    return Response(generate_latest(api.metrics.registry), media_type=CONTENT_TYPE_LATEST)
