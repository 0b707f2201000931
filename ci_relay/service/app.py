"""The FastAPI application: intake, read API, dashboard, health and metrics."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from ci_relay import dashboard
from ci_relay.audit import AuditLog
from ci_relay.context import RelayContext
from ci_relay.dashboard import ingest as crcr_ingest
from ci_relay.intake import mount as intake
from ci_relay.metrics import Metrics
from ci_relay.service import api
from ci_relay.steps import Next

# How long a thread may hold the GIL while another waits (Python's default: 5 ms). The
# publisher thread builds and sends a Celery message per delivery (about 0.8 ms of CPU); at
# the default, a webhook request waiting behind it took up to 28-68 ms at p99 on PostgreSQL
# + Redis, and 13-17 ms at 0.5 ms (bench/bench_intake.py, bench/README).
GIL_SWITCH_SECONDS = 0.0005


def create_app(
    rt: RelayContext,
    enqueue: Callable[[list[Next]], None],
    broker_ok: Callable[[], bool] = lambda: True,
) -> FastAPI:
    """Build the app around a runtime; ``enqueue`` sends pipeline steps to the queue."""
    audit_log = AuditLog(rt.db, rt.settings.audit_window_seconds)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        checkpoints = rt.db.defer_checkpoints()  # SQLite: off the request path
        switch = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        try:
            yield
        finally:
            sys.setswitchinterval(switch)
            audit_log.flush()  # counts of rejections still only in memory
            if checkpoints is not None:
                checkpoints.set()

    app = FastAPI(title="ci-relay", version="0.1.0", lifespan=lifespan)
    metrics = Metrics()
    app.state.metrics = metrics
    app.state.audit_log = audit_log
    intake.install(app, rt, metrics, enqueue, audit_log)
    api.install(app, rt, metrics, broker_ok)
    crcr_ingest.install(app, rt, audit_log)
    dashboard.install(app, rt)
    return app
