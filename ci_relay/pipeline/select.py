"""Step 2: the four-stage selector plans a run's tests from the upstream mirror, fed by
the backend's past results, and splits them into shards."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ci_relay.checkouts import CheckoutError, upstream_mirror
from ci_relay.context import RelayContext
from ci_relay.coverage_maps import MapChoice, usable_map
from ci_relay.pipeline.upgrade import upgrade_plan_json
from ci_relay.reporting.outbox import enqueue_reports
from ci_relay.steps import Next, claim_pending_or_stale, report_steps
from ci_relay.store.models import (
    Change,
    Run,
    RunState,
    Selection,
    Shard,
    ShardState,
    TestResult,
    Upgrade,
    utcnow,
)
from reuse_specs.errors import SpecErrors
from test_selection.agents import agent_by_name
from test_selection.coverage.map import CoverageMap, CoverageMapError
from test_selection.coverage.select import check_map
from test_selection.git import Repo
from test_selection.layout import EmptyUniverse
from test_selection.observations import Observation
from test_selection.selector import SelectorConfig
from test_selection.selector import select as select_tests_for
from test_selection.types import Budget, TestPlan

log = logging.getLogger("ci_relay.pipeline")


def select_tests(rt: RelayContext, run_id: int, stale_after: timedelta) -> list[Next]:
    """Run the four-stage selector for a run's change and store its plan and shards."""
    with rt.db.session() as session:
        claimed = claim_pending_or_stale(
            session, Run, run_id, RunState.PENDING, RunState.SELECTING, stale_after
        )
        run = session.get(Run, run_id)
        if run is None:
            return []
        if not claimed:
            return [
                Next("execute", s.id, run.backend)
                for s in run.shards
                if s.state == ShardState.PENDING
            ]
        head, base, backend = run.change.head_sha, run.change.base_sha, run.backend
        # a nightly without a previous one (or under nightly_scope: all) runs the universe
        everything = run.change.kind == "nightly" and base is None
        repository = run.change.repository
        upgrade = run.change.kind == "upgrade"  # a release upgrade's side: its fixed list
        fixed: dict[str, Any] | None = None
        if upgrade:
            job, side = _upgrade_of(session, run.change_id)
            if job is not None:
                fixed = upgrade_plan_json(job.plan, side, rt.settings.shards_per_run)
        again = _rerun_plan(session, run)
    if again is not None:  # queued again by hand: the recovered run's plan, not a new one
        return _start(rt, run_id, "rerun", again[0], again[1], backend)
    if upgrade:
        if fixed is None:
            return _run_failed(rt, run_id, "selection failed: its upgrade job is gone")
        return _start(rt, run_id, "upgrade", fixed, fixed["shards"], backend)
    try:
        observations = past_observations(rt, repository, backend, exclude_run=run_id)
        label = rt.policy.label_for(repository, backend)
        found = (
            usable_map(rt, repository, backend)
            if rt.settings.coverage_select and not everything
            else MapChoice(None, None, [])
        )
        mode = rt.policy.selection_for(repository, backend)
        plan = _plan(rt, head, base, observations, everything, label, found.map, mode)
        plan.notes += found.notes
        if plan.coverage and found.run_id is not None:
            plan.coverage["run"] = found.run_id
    except (CheckoutError, SpecErrors, EmptyUniverse) as exc:  # no commit, bad spec, no test
        log.error("run %s: selection impossible: %s", run_id, exc)
        return _run_failed(rt, run_id, f"selection failed: {exc}")
    return _start(rt, run_id, f"four-stage/{plan.agent}", plan.to_json(), plan.shards, backend)


def _upgrade_of(session: Session, change_id: int) -> tuple[Upgrade | None, str]:
    job = session.scalars(
        select(Upgrade).where(
            (Upgrade.base_change_id == change_id) | (Upgrade.head_change_id == change_id)
        )
    ).first()
    return job, "base" if job is not None and job.base_change_id == change_id else "head"


def _rerun_plan(session: Session, run: Run) -> tuple[dict[str, Any], list[list[str]]] | None:
    """A rerun's plan and shards: the recovered run's, whole or its failed shards only
    (None: not a rerun, or the recovered run never got a plan, so it is selected anew)."""
    from ci_relay.intake.reruns import FAILED, failed_shards

    if run.rerun_of is None:
        return None
    first = session.get(Run, run.rerun_of)
    if first is None or first.selection is None:
        return None
    plan = dict(first.selection.plan)
    shards = {s.index: list(s.test_files) for s in first.shards}
    if run.rerun_scope == FAILED:
        keep = set(failed_shards(first))
        shards = {i: tests for i, tests in shards.items() if i in keep}
        chosen = {t for tests in shards.values() for t in tests}
        plan["selected"] = [t for t in plan.get("selected", []) if t.get("test") in chosen]
    plan["shards"] = [shards[i] for i in sorted(shards)]
    plan["rerun"] = {"of": first.id, "scope": run.rerun_scope, "attempt": run.attempt}
    plan["notes"] = [
        f"run {first.id} (attempt {first.attempt}) queued again by hand: "
        + ("its failed shards" if run.rerun_scope == FAILED else "its plan")
        + " run again, not selected anew",
        *plan.get("notes", []),
    ]
    return plan, plan["shards"]


def _start(
    rt: RelayContext,
    run_id: int,
    strategy: str,
    plan: dict[str, Any],
    shard_tests: list[list[str]],
    backend: str,
) -> list[Next]:
    """Store the run's selection and shards; queue the shards (or close an empty run)."""
    with rt.db.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        session.add(Selection(run=run, strategy=strategy, plan=plan))
        shards = [
            Shard(run=run, index=i, test_files=tests)
            for i, tests in enumerate(shard_tests)
            if tests
        ]
        session.add_all(shards)
        run.started_at = utcnow()
        if not shards:
            run.state, run.conclusion, run.finished_at = RunState.COMPLETED, "neutral", utcnow()
            log.info("run %s: the selector chose no test", run_id)
            return report_steps(enqueue_reports(session, rt, run, "completed"))
        run.state = RunState.RUNNING
        reports = report_steps(enqueue_reports(session, rt, run, "in_progress"))
        session.flush()
        log.info(
            "run %s: %d of %s tests selected in %d shard(s)",
            run_id,
            len(plan.get("selected", [])),
            plan.get("universe_size"),
            len(shards),
        )
        return [Next("execute", shard.id, backend) for shard in shards] + reports


LEARN_FROM_RUNS = 20  # the newest runs of a backend whose results the selector learns from
LEARN_MAX_RESULTS = 200_000


def past_observations(
    rt: RelayContext, repository: str, backend: str, exclude_run: int | None = None
) -> tuple[Observation, ...]:
    """The results of the newest finished runs of this repository on this backend: what the
    selector learns durations, failures and flakes from."""
    with rt.db.session() as session:
        run_ids = list(
            session.scalars(
                select(Run.id)
                .join(Change)
                .where(
                    Change.repository == repository,
                    Run.backend == backend,
                    Run.state == RunState.COMPLETED,
                    Run.id != (exclude_run or -1),
                )
                .order_by(Run.id.desc())
                .limit(LEARN_FROM_RUNS)
            )
        )
        if not run_ids:
            return ()
        rows = session.execute(
            select(TestResult.nodeid, TestResult.outcome, TestResult.duration, Shard.run_id)
            .join(Shard, Shard.id == TestResult.shard_id)
            .where(Shard.run_id.in_(run_ids))
            .limit(LEARN_MAX_RESULTS)
        ).all()
    return tuple(Observation(n, o, float(d or 0.0), r) for n, o, d, r in rows)


def _plan(
    rt: RelayContext,
    head: str,
    base: str | None,
    observations: tuple[Observation, ...] = (),
    everything: bool = False,
    label: str | None = None,
    coverage: CoverageMap | None = None,
    mode: str = "ranked",
) -> TestPlan:
    """The four-stage selector's plan for head against base (or head's parent); every test
    the specs allow when ``everything``. ``coverage``: the backend's newest map, used when
    it is of this history (a map the mirror cannot place is ignored with a warning)."""
    mirror = upstream_mirror(rt.settings)
    settings = rt.settings
    budget = Budget("all") if everything else Budget.parse(settings.selection_budget)
    mirror.ensure(head)
    if base is not None:
        mirror.ensure(base)
    else:  # a new branch: compare with the parent, or run everything for a root
        parent = mirror.rev_parse(f"{head}^")
        base, budget = (parent, budget) if parent else (head, Budget("all"))
    cache = settings.data_dir.resolve() / "cache"
    config = SelectorConfig(
        budget=budget,
        agent=agent_by_name(
            settings.selection_agent,
            cache,
            settings.llm_url,
            settings.llm_model,
            settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
        ),
        shards=settings.shards_per_run,
        cache_dir=cache,
        observations=observations,
        label=label,
        mode="ranked" if everything else mode,  # a run of everything needs no tracing
    )
    with mirror.tree(head) as tree:
        if coverage is not None:
            try:
                check_map(coverage, Repo(tree), coverage.repository)
                config.coverage = coverage.index()
            except CoverageMapError as exc:
                log.warning("selection without a coverage map: %s", exc)
        plan, _ = select_tests_for(tree, base, head, rt.specs, config)
    return plan


def _run_failed(rt: RelayContext, run_id: int, error: str) -> list[Next]:
    """End a run that cannot be tested (an infrastructure error), and report it."""
    with rt.db.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        run.state, run.conclusion, run.error = RunState.COMPLETED, "error", error[:4000]
        run.finished_at = utcnow()
        return report_steps(enqueue_reports(session, rt, run, "completed"))
