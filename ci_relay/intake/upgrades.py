"""``POST /api/upgrades``: a release upgrade job, behind the dispatch token."""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Request, Security
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ci_relay.api_docs import DISPATCH_AUTH, errors, json_body
from ci_relay.intake.routes import intake_of
from ci_relay.intake.wire import UpgradeAccepted, UpgradeRequest
from ci_relay.steps import Next
from ci_relay.store.models import Upgrade

log = logging.getLogger("ci_relay.intake")

router = APIRouter()


@router.post(
    "/api/upgrades",
    status_code=202,
    response_model=UpgradeAccepted,
    responses=errors(400, 401, 413, 422),
    openapi_extra=json_body(UpgradeRequest.model_json_schema(), "the upgrade to test"),
    dependencies=[Security(DISPATCH_AUTH)],
)
async def submit_upgrade(request: Request) -> JSONResponse:
    """A release upgrade job (behind the dispatch token): the specs' tests that changed
    between ``base`` and ``head`` run at both on each backend; ``url`` compares them."""
    intake = intake_of(request)
    started = time.perf_counter()
    wanted = await intake.guarded_body(
        request, UpgradeRequest, "upgrade", "upgrades are disabled (no token set)", started
    )
    if isinstance(wanted, JSONResponse):
        return wanted
    repo_policy = intake.rt.policy.for_repository(wanted.repository)
    if repo_policy is None:
        reason = f"repository {wanted.repository} is not in the allowlist"
        return await intake.reject(request, 422, reason, "upgrade", started)
    allowed = sorted(repo_policy.backends)
    backends = wanted.backends or allowed
    unknown = sorted(set(backends) - set(allowed))
    if unknown:
        reason = f"backends {', '.join(unknown)} do not run for {wanted.repository}"
        return await intake.reject(request, 422, reason, "upgrade", started)

    def create() -> int:
        with intake.rt.db.session() as session:
            job = Upgrade(
                repository=wanted.repository,
                base_sha=wanted.base,
                head_sha=wanted.head,
                backends=list(dict.fromkeys(backends)),
                plan={},
            )
            session.add(job)
            session.flush()
            return job.id

    upgrade_id = await run_in_threadpool(create)
    await run_in_threadpool(intake.enqueue, [Next("upgrade", upgrade_id)])
    log.info("upgrade %s: %s..%s queued", upgrade_id, wanted.base[:12], wanted.head[:12])
    return JSONResponse(
        {"id": upgrade_id, "url": f"/upgrades/{upgrade_id}", "state": "pending"},
        status_code=202,
    )
