"""The release upgrade job: plan the A..B test diff, then run what changed at both sides.

Each side becomes a change of kind ``upgrade`` (its own stored request as the delivery), so
its runs go through select, execute and collect like any other and the grid shows them as
their own row kind; select gives them the upgrade's fixed test list instead of a selection,
and no report leaves the relay for them (they test a release range, not a pull request).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from ci_relay.checkouts import CheckoutError, upstream_mirror
from ci_relay.context import RelayContext
from ci_relay.steps import Next, claim_pending_or_stale
from ci_relay.store.models import (
    Change,
    Delivery,
    DeliveryState,
    Run,
    Upgrade,
    UpgradeState,
    utcnow,
)
from test_selection.types import TestId

log = logging.getLogger("ci_relay.pipeline")

SIDES = ("base", "head")


def plan_upgrade_job(rt: RelayContext, upgrade_id: int, stale_after: timedelta) -> list[Next]:
    """Diff the specs' tests between the upgrade's two commits, then queue a run of the
    changed set on each backend at each side."""
    from test_selection.upgrade.spec_impact import UpgradeError, plan_upgrade

    with rt.db.session() as session:
        claimed = claim_pending_or_stale(
            session, Upgrade, upgrade_id, UpgradeState.PENDING, UpgradeState.PLANNING, stale_after
        )
        job = session.get(Upgrade, upgrade_id)
        if job is None or not claimed:
            return []
        base, head, repository = job.base_sha, job.head_sha, job.repository
        backends = list(job.backends)
    try:
        mirror = upstream_mirror(rt.settings)
        mirror.ensure(base)
        mirror.ensure(head)
        plan = plan_upgrade(mirror.path, base, head, rt.specs).to_json()
    except (CheckoutError, UpgradeError) as exc:
        log.error("upgrade %s: no plan: %s", upgrade_id, exc)
        with rt.db.session() as session:
            job = session.get(Upgrade, upgrade_id)
            assert job is not None
            job.state, job.error = UpgradeState.FAILED, str(exc)[:4000]
        return []
    repo_policy = rt.policy.for_repository(repository)
    levels = {b: p.level.value for b, p in (repo_policy.backends if repo_policy else {}).items()}
    steps: list[Next] = []
    with rt.db.session() as session:
        job = session.get(Upgrade, upgrade_id)
        assert job is not None
        job.plan = plan
        for side, sha, other in (("base", base, head), ("head", head, base)):
            body = json.dumps({"upgrade": upgrade_id, "side": side, "base": base, "head": head})
            delivery = Delivery(
                source="upgrade",
                hook_id="upgrade",
                delivery_id=f"upgrade-{upgrade_id}-{side}",
                event="upgrade",
                repository=repository,
                head_sha=sha,
                state=DeliveryState.PROCESSED,
                headers={},
                body=body.encode(),
                processed_at=utcnow(),
            )
            change = Change(
                delivery=delivery,
                repository=repository,
                kind="upgrade",
                ref=f"upgrade {base[:12]}..{head[:12]} ({'A' if side == 'base' else 'B'})",
                base_sha=other,
                head_sha=sha,
                labels=[],
            )
            session.add_all([delivery, change])
            runs = [
                Run(change=change, backend=b, attempt=1, level=levels.get(b, "L2"))
                for b in backends
            ]
            session.add_all(runs)
            session.flush()
            if side == "base":
                job.base_change_id = change.id
            else:
                job.head_change_id = change.id
            steps += [Next("select", run.id) for run in runs]
        job.state = UpgradeState.RUNNING
    log.info(
        "upgrade %s: %s of %s tests need a run; %d run(s) queued",
        upgrade_id,
        plan.get("need_run"),
        plan.get("tests_at_head"),
        len(steps),
    )
    return steps


def upgrade_tests(plan: dict[str, Any], side: str) -> list[str]:
    """The upgrade's run list as one side names it: at A, a renamed or moved test under its
    old name, and nothing for a test B added."""
    tests: list[str] = []
    for change in plan.get("changes", []):
        if not isinstance(change, dict) or change.get("kind") == "removed":
            continue
        if side == "head":
            tests.append(str(change["test"]))
        elif change.get("kind") in ("renamed", "moved") and change.get("was"):
            tests.append(str(change["was"]))
        elif change.get("kind") != "added":
            tests.append(str(change["test"]))
    return sorted(set(tests))


def upgrade_plan_json(plan: dict[str, Any], side: str, shards: int) -> dict[str, Any]:
    """What a side's run stores as its selection: the fixed list, in shards by file."""
    tests = upgrade_tests(plan, side)
    evidence = {
        str(c.get("was") if side == "base" and c.get("was") else c.get("test")): c
        for c in plan.get("changes", [])
        if isinstance(c, dict)
    }
    files = sorted({TestId.parse(t).file for t in tests})
    count = max(1, min(shards, len(files)))
    groups: list[list[str]] = [[] for _ in range(count)]
    for index, file in enumerate(files):
        groups[index % count] += [t for t in tests if TestId.parse(t).file == file]
    return {
        "base": plan.get("base"),
        "head": plan.get("head"),
        "budget": "upgrade",
        "agent": "none",
        "universe_size": plan.get("tests_at_head" if side == "head" else "tests_at_base", 0),
        "selected": [
            {
                "test": t,
                "file": TestId.parse(t).file,
                "score": 1.0,
                "reasons": [f"{evidence[t]['kind']}: {evidence[t]['evidence'][0]}"]
                if t in evidence and evidence[t].get("evidence")
                else [],
            }
            for t in tests
        ],
        "excluded": [],
        "shards": [g for g in groups if g],
        "change": {"files": [], "file_count": plan.get("files_changed", 0)},
        "notes": [f"upgrade {str(plan.get('base'))[:12]}..{str(plan.get('head'))[:12]}, {side}"],
    }
