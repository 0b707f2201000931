"""Step 1: a stored delivery becomes a change, and the change a run per backend that
should test it (or a recorded reason why not)."""

from __future__ import annotations

import logging

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ci_relay.context import RelayContext
from ci_relay.intake.events import ChangeIntent, InvalidPayload, summarize
from ci_relay.steps import Next, delivery_event
from ci_relay.store.models import (
    Change,
    Delivery,
    DeliveryState,
    Run,
    utcnow,
)

log = logging.getLogger("ci_relay.pipeline")


def process_delivery(rt: RelayContext, delivery_pk: int) -> list[Next]:
    """Turn a received delivery into a change and the runs its policy asks for."""
    with rt.db.session() as session:
        delivery = session.get(Delivery, delivery_pk)
        if delivery is None or delivery.state != DeliveryState.RECEIVED:
            return []
        delivery.attempts += 1
        event, payload = delivery_event(delivery)
        try:
            meaning = summarize(event, payload)
        except InvalidPayload as exc:  # stored before intake validated it (or replayed)
            delivery.state, delivery.reason = DeliveryState.IGNORED, f"refused: {exc}"
            delivery.processed_at = utcnow()
            log.warning("delivery %s refused: %s", delivery.delivery_id, exc)
            return []
        repo_policy = rt.policy.for_repository(meaning.repository)
        if repo_policy is None:
            delivery.state, delivery.reason = (
                DeliveryState.IGNORED,
                f"repository {meaning.repository} is not in the allowlist",
            )
        elif meaning.change is None:
            delivery.state, delivery.reason = DeliveryState.IGNORED, meaning.ignore_reason
        delivery.processed_at = utcnow()
        if delivery.state == DeliveryState.IGNORED or meaning.change is None or not repo_policy:
            log.info("ignored: %s", delivery.reason)
            return []
        intent = meaning.change
        kind, number, labels, base = intent.kind, intent.number, intent.labels, intent.base_sha
        if intent.kind == "rerun":  # rerun what the last change of this head was
            previous = session.scalars(
                select(Change)
                .where(Change.repository == intent.repository, Change.head_sha == intent.head_sha)
                .where(Change.kind != "rerun")
                .order_by(Change.id.desc())
            ).first()
            if previous is not None:
                kind, number, labels, base = (
                    previous.kind,
                    previous.number,
                    previous.labels,
                    previous.base_sha,
                )
        change = Change(
            delivery_pk=delivery.id,
            repository=intent.repository,
            kind=intent.kind,
            number=number,
            ref=intent.ref,
            base_sha=base,
            head_sha=intent.head_sha,
            labels=list(labels),
        )
        session.add(change)
        delivery.state = DeliveryState.PROCESSED
        runs: list[Run] = []
        already: list[str] = []
        if intent.runs_tests:
            for backend, level in rt.policy.runs_for(repo_policy, kind, list(labels)):
                if intent.kind not in ("rerun", "nightly") and _has_run(
                    session, intent.head_sha, intent, backend
                ):
                    already.append(backend)  # only a rerun request adds a run for a tested head
                    continue
                attempt = 1 + (
                    session.scalar(
                        select(func.max(Run.attempt))
                        .join(Change)
                        .where(
                            Change.repository == intent.repository,
                            Change.head_sha == intent.head_sha,
                            Run.backend == backend,
                        )
                    )
                    or 0
                )
                run = Run(change=change, backend=backend, attempt=attempt, level=level.value)
                session.add(run)
                runs.append(run)
        skipped = rt.policy.skipped_for(repo_policy, kind) if intent.runs_tests else []
        if skipped:
            change.skipped = skipped
        if not runs:
            note = (
                f"head already tested on {', '.join(already)}"
                if already
                else "; ".join(f"{s['backend']}: {s['reason']}" for s in skipped)
                if skipped
                else "no backend runs for this change under the policy"
            )
            delivery.reason = f"{delivery.reason}; {note}" if delivery.reason else note
        try:
            session.flush()
        except IntegrityError:  # a concurrent worker processed the same delivery
            session.rollback()
            return []
        log.info(
            "%s %s at %s: change %s, %d run(s)%s",
            intent.repository,
            intent.kind,
            intent.head_sha[:12],
            change.id,
            len(runs),
            f" ({delivery.reason})" if delivery.reason else "",
        )
        return [Next("select", run.id) for run in runs]


def _has_run(session: Session, head_sha: str, intent: ChangeIntent, backend: str) -> bool:
    return (
        session.scalar(
            select(func.count())
            .select_from(Run)
            .join(Change)
            .where(
                Change.repository == intent.repository,
                Change.head_sha == head_sha,
                Run.backend == backend,
            )
        )
        or 0
    ) > 0
