"""The intake's three route groups mounted on the app, with what they share: the webhooks
(:mod:`routes`, which holds :class:`Intake`), release upgrades and reruns. Apart from the
routes so that no group imports another's importer."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from ci_relay.audit import AuditLog
from ci_relay.context import RelayContext
from ci_relay.intake import reruns, upgrades
from ci_relay.intake.routes import Intake, router
from ci_relay.metrics import Metrics
from ci_relay.steps import Next


def install(
    app: FastAPI,
    rt: RelayContext,
    metrics: Metrics,
    enqueue: Callable[[list[Next]], None],
    audit_log: AuditLog,
) -> None:
    """Mount the intake's routes on ``app`` with what they share."""
    app.state.intake = Intake(rt, metrics, enqueue, audit_log)
    app.include_router(router)
    app.include_router(upgrades.router)
    app.include_router(reruns.router)
