"""HUD-format results from other relays: upsert on HUD's key, list for the dashboard.

The raw body is kept as received; the columns are what a listing filters and shows. A
late ``in_progress`` never overwrites a ``completed`` record of the same key (reports can
arrive out of order when a sender retries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from ci_relay.identifiers import is_commit_id, is_repository_name
from ci_relay.reporting.wire import HudBody
from ci_relay.store.database import Database
from ci_relay.store.models import CrcrResult, utcnow

UPSERT_TRIES = 3


@dataclass(frozen=True)
class Stored:
    id: int
    created: bool
    updated: bool


def _upstream_change(payload: dict[str, Any]) -> tuple[str | None, str | None]:
    """(repository, head commit) of the upstream event a result is about, when the
    sender's echo of it carries well-formed ones (it is untrusted: anything else is None)."""
    repository = payload.get("repository")
    name = repository.get("full_name") if isinstance(repository, dict) else None
    pull, check_run = payload.get("pull_request"), payload.get("check_run")
    if isinstance(pull, dict):
        head = pull.get("head")
        sha = head.get("sha") if isinstance(head, dict) else None
    elif isinstance(check_run, dict):
        sha = check_run.get("head_sha")
    else:
        sha = payload.get("after")
    return (
        name if isinstance(name, str) and is_repository_name(name) else None,
        sha if isinstance(sha, str) and is_commit_id(sha) else None,
    )


def _columns(body: HudBody, raw: bytes) -> dict[str, Any]:
    callback = body.untrusted.callback_payload
    workflow = callback.workflow
    upstream_repo, head = _upstream_change(callback.payload)
    summary = workflow.model_dump(mode="json", exclude={"failed_tests"})
    summary["failed_tests_listed"] = len(workflow.failed_tests)
    summary["ci_metrics"] = body.trusted.ci_metrics.model_dump(mode="json")
    return {
        "level": body.trusted.downstream_repo_level,
        "event_type": callback.event_type,
        "status": workflow.status,
        "conclusion": workflow.conclusion,
        "upstream_repo": upstream_repo,
        "head_sha": head,
        "summary": summary,
        "body": raw,
    }


def upsert(db: Database, body: HudBody, raw: bytes) -> Stored:
    """Insert, or update the record with the same HUD key (safe under concurrent posts)."""
    repo, delivery, name, job, check_run = body.key()
    key = {
        "verified_repo": repo,
        "delivery_id": delivery,
        "workflow_name": name,
        "job_name": job,
        "check_run_id": check_run,
    }
    columns = _columns(body, raw)
    for _ in range(UPSERT_TRIES):
        with db.session() as session:
            existing = session.scalars(
                select(CrcrResult).filter_by(**key).with_for_update()
            ).one_or_none()
            if existing is not None:
                if existing.status == "completed" and columns["status"] != "completed":
                    return Stored(existing.id, created=False, updated=False)
                for name_, value in columns.items():
                    setattr(existing, name_, value)
                existing.updated_at = utcnow()
                return Stored(existing.id, created=False, updated=True)
        try:
            with db.session() as session:
                row = CrcrResult(**key, **columns)
                session.add(row)
                session.flush()
                return Stored(row.id, created=True, updated=False)
        except IntegrityError:  # another request inserted the same key first: update it
            continue
    raise RuntimeError(f"could not store result {'/'.join(key.values())}")


def result_json(row: CrcrResult) -> dict[str, Any]:
    return {
        "id": row.id,
        "key": "/".join(
            (row.verified_repo, row.delivery_id, row.workflow_name, row.job_name, row.check_run_id)
        ),
        "verified_repo": row.verified_repo,
        "level": row.level,
        "delivery_id": row.delivery_id,
        "event_type": row.event_type,
        "workflow_name": row.workflow_name,
        "job_name": row.job_name,
        "check_run_id": row.check_run_id,
        "status": row.status,
        "conclusion": row.conclusion,
        "upstream_repo": row.upstream_repo,
        "head_sha": row.head_sha,
        "workflow": row.summary,
        "received_at": row.received_at.isoformat() if row.received_at else None,
        "updated_at": row.updated_at.isoformat() if row.updated_at else None,
    }


def listing(db: Database, repo: str | None, limit: int) -> list[dict[str, Any]]:
    """Newest first; ``repo`` matches the sending relay (``verified_repo``) or the upstream."""
    with db.session() as session:
        query = select(CrcrResult).order_by(CrcrResult.updated_at.desc(), CrcrResult.id.desc())
        if repo:
            query = query.where(
                (CrcrResult.verified_repo == repo) | (CrcrResult.upstream_repo == repo)
            )
        return [result_json(r) for r in session.scalars(query.limit(limit))]


def body_of(db: Database, result_id: int) -> bytes | None:
    with db.session() as session:
        row = session.get(CrcrResult, result_id)
        return row.body if row else None
