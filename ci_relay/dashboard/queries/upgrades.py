"""The upgrade page: a release upgrade's changed tests, at A and at B, per backend.

Variants are matched across the two sides through the generic tests they instantiate (a
test renamed between A and B is matched under its new name), so ``TestXCPU::test_y_cpu``
at A and at B land on one row whatever the rename.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ci_relay.dashboard.views import BackendComparison, ComparisonRow, UpgradePage, UpgradeRow
from ci_relay.execution.outcomes import BAD_OUTCOMES
from ci_relay.store.models import Run, RunState, Selection, Shard, TestResult, Upgrade
from test_selection.variants import match_variants, split_nodeid

UPGRADE = "upgrade"  # the Change.kind of an upgrade's two sides
CATEGORIES = ("newly failing", "newly passing", "still failing", "not run", "passing")
RECENT = 10


def _category(base: str | None, head: str | None) -> str:
    if base in (None, "skipped") or head in (None, "skipped"):
        return "not run"
    bad_base, bad_head = base in BAD_OUTCOMES, head in BAD_OUTCOMES
    if bad_head:
        return "still failing" if bad_base else "newly failing"
    return "newly passing" if bad_base else "passing"


def _results(session: Session, run_id: int | None) -> tuple[dict[str, str], list[str]]:
    """A run's outcome per variant, and the generic tests its selection named."""
    if run_id is None:
        return {}, []
    outcomes = {
        nodeid: outcome
        for nodeid, outcome in session.execute(
            select(TestResult.nodeid, TestResult.outcome)
            .join(Shard, TestResult.shard_id == Shard.id)
            .where(Shard.run_id == run_id)
        )
    }
    plan = session.scalar(select(Selection.plan).where(Selection.run_id == run_id)) or {}
    generic = [str(t.get("test")) for t in plan.get("selected", []) if isinstance(t, dict)]
    return outcomes, generic


def _keyed(
    outcomes: dict[str, str], generic: list[str], rename: dict[str, str]
) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(generic at B, class suffix, name suffix) -> (variant node id, outcome)."""
    owners = {v: g for g, vs in match_variants(generic, outcomes).items() for v in vs}
    out: dict[tuple[str, str, str], tuple[str, str]] = {}
    for nodeid, outcome in outcomes.items():
        owner = owners.get(nodeid)
        if owner is None:
            out[(nodeid, "", "")] = (nodeid, outcome)
            continue
        _, cls_v, name_v = split_nodeid(nodeid)
        _, cls_g, name_g = split_nodeid(owner)
        key = (rename.get(owner, owner), cls_v[len(cls_g) :], name_v[len(name_g) :])
        out[key] = (nodeid, outcome)
    return out


def _runs(session: Session, change_id: int | None) -> dict[str, Run]:
    if change_id is None:
        return {}
    return {r.backend: r for r in session.scalars(select(Run).where(Run.change_id == change_id))}


def _compare(
    session: Session, job: Upgrade, backend: str, base: Run | None, head: Run | None
) -> BackendComparison:
    plan: dict[str, Any] = job.plan or {}
    changes = [c for c in plan.get("changes", []) if isinstance(c, dict)]
    rename = {str(c["was"]): str(c["test"]) for c in changes if c.get("was")}
    why = {str(c["test"]): str(c.get("kind")) for c in changes}
    at_a = _keyed(*_results(session, base.id if base else None), rename)
    at_b = _keyed(*_results(session, head.id if head else None), {})
    rows: list[ComparisonRow] = []
    for key in sorted(at_a.keys() | at_b.keys()):
        a, b = at_a.get(key), at_b.get(key)
        test = (b or a or (key[0], ""))[0]
        rows.append(
            ComparisonRow(
                test=test,
                category=_category(a[1] if a else None, b[1] if b else None),
                base=a[1] if a else None,
                head=b[1] if b else None,
                change=why.get(key[0]),
            )
        )
    order = {c: i for i, c in enumerate(CATEGORIES)}
    rows.sort(key=lambda r: (order[r.category], r.test))
    counts = Counter(r.category for r in rows)
    finished = all(r is not None and r.state == RunState.COMPLETED for r in (base, head))
    return BackendComparison(
        backend=backend,
        base_run=base.id if base else None,
        head_run=head.id if head else None,
        finished=finished,
        counts={c: counts.get(c, 0) for c in CATEGORIES},
        rows=rows,
    )


def upgrade_page(session: Session, upgrade_id: int) -> UpgradePage | None:
    job = session.get(Upgrade, upgrade_id)
    if job is None:
        return None
    base_runs, head_runs = _runs(session, job.base_change_id), _runs(session, job.head_change_id)
    plan: dict[str, Any] = job.plan or {}
    impact = plan.get("spec_impact") or {}
    return UpgradePage(
        id=job.id,
        repository=job.repository,
        base_sha=job.base_sha,
        head_sha=job.head_sha,
        state=job.state,
        error=job.error,
        created_at=job.created_at,
        commits=plan.get("commits"),
        need_run=plan.get("need_run"),
        tests_at_head=plan.get("tests_at_head"),
        by_kind={str(k): int(v) for k, v in (plan.get("by_kind") or {}).items()},
        spec_edits=len(impact.get("edits") or []),
        needs_person=[str(u) for u in impact.get("unresolved") or []],
        has_patch=bool(plan.get("patch")),
        backends=[
            _compare(session, job, b, base_runs.get(b), head_runs.get(b)) for b in job.backends
        ],
    )


def upgrade_patch(session: Session, upgrade_id: int) -> str | None:
    job = session.get(Upgrade, upgrade_id)
    return None if job is None else str((job.plan or {}).get("patch") or "")


def recent_upgrades(session: Session, limit: int = RECENT) -> list[UpgradeRow]:
    """The grid's upgrade rows: the newest jobs, each backend's comparison in counts."""
    rows: list[UpgradeRow] = []
    for job in session.scalars(select(Upgrade).order_by(Upgrade.id.desc()).limit(limit)):
        page = upgrade_page(session, job.id)
        assert page is not None
        rows.append(
            UpgradeRow(
                id=job.id,
                repository=job.repository,
                base_sha=job.base_sha,
                head_sha=job.head_sha,
                state=job.state,
                need_run=page.need_run,
                tests_at_head=page.tests_at_head,
                created_at=job.created_at,
                cells={c.backend: c.counts for c in page.backends},
            )
        )
    return rows
