"""The relay's steps as plain functions over the database: deliveries -> changes -> runs -> results.

Each step is idempotent and claims its row with a conditional update, so a
duplicated or redelivered task does nothing twice; Celery tasks in
:mod:`ci_relay.service.tasks` only call these and enqueue what they return.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ci_relay.checkouts import CheckoutError, UpstreamMirror
from ci_relay.context import RelayContext
from ci_relay.execution.devices import claim_device
from ci_relay.execution.outcomes import BAD_OUTCOMES
from ci_relay.execution.runtimes import Limits, RuntimeOptions, RuntimeUnavailable, get_runtime
from ci_relay.execution.runtimes import Runtime as Isolation
from ci_relay.execution.shard import ShardRequest, run_shard
from ci_relay.intake.events import ChangeIntent, InvalidPayload, summarize
from ci_relay.reporting.outbox import due as due_reports
from ci_relay.reporting.outbox import enqueue_reports
from ci_relay.settings import Settings
from ci_relay.steps import Next, claim_rows, delivery_event
from ci_relay.store.models import (
    Change,
    Delivery,
    DeliveryState,
    OutboxMessage,
    Run,
    RunState,
    Selection,
    Shard,
    ShardState,
    TestResult,
    utcnow,
)
from reuse_specs.backends import get_backend
from reuse_specs.errors import SpecErrors
from test_selection.agents import agent_by_name
from test_selection.layout import EmptyUniverse
from test_selection.observations import Observation
from test_selection.selector import SelectorConfig
from test_selection.selector import select as select_tests_for
from test_selection.types import Budget, TestPlan

log = logging.getLogger("ci_relay.pipeline")

SHARD_TIMEOUT_SECONDS = 3600


def delivery_id_of(rt: RelayContext, task: str, pk: int) -> str | None:
    """The GitHub/CRCR delivery id a task's row descends from (for log context)."""
    with rt.db.session() as session:
        if task == "process":
            query = select(Delivery.delivery_id).where(Delivery.id == pk)
        elif task == "report":
            query = (
                select(Delivery.delivery_id)
                .join(Change, Change.delivery_pk == Delivery.id)
                .join(Run, Run.change_id == Change.id)
                .join(OutboxMessage, OutboxMessage.run_id == Run.id)
                .where(OutboxMessage.id == pk)
            )
        elif task == "execute":
            query = (
                select(Delivery.delivery_id)
                .join(Change, Change.delivery_pk == Delivery.id)
                .join(Run, Run.change_id == Change.id)
                .join(Shard, Shard.run_id == Run.id)
                .where(Shard.id == pk)
            )
        else:
            query = (
                select(Delivery.delivery_id)
                .join(Change, Change.delivery_pk == Delivery.id)
                .join(Run, Run.change_id == Change.id)
                .where(Run.id == pk)
            )
        return session.scalar(query)


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
                if intent.kind != "rerun" and _has_run(session, intent.head_sha, intent, backend):
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
        if not runs:
            note = (
                f"head already tested on {', '.join(already)}"
                if already
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


def select_tests(rt: RelayContext, run_id: int, stale_after: timedelta) -> list[Next]:
    """Run the four-stage selector for a run's change and store its plan and shards."""
    with rt.db.session() as session:
        claimed = claim_rows(
            session,
            update(Run)
            .where(Run.id == run_id)
            .where(
                or_(
                    Run.state == RunState.PENDING,
                    (Run.state == RunState.SELECTING) & (Run.updated_at < utcnow() - stale_after),
                )
            )
            .values(state=RunState.SELECTING, updated_at=utcnow()),
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
        repository = run.change.repository
    try:
        observations = past_observations(rt, repository, backend, exclude_run=run_id)
        plan = _plan(rt, head, base, observations)
    except (CheckoutError, SpecErrors, EmptyUniverse) as exc:  # no commit, bad spec, no test
        log.error("run %s: selection impossible: %s", run_id, exc)
        return _run_failed(rt, run_id, f"selection failed: {exc}")
    with rt.db.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        session.add(Selection(run=run, strategy=f"four-stage/{plan.agent}", plan=plan.to_json()))
        shards = [
            Shard(run=run, index=i, test_files=tests)
            for i, tests in enumerate(plan.shards)
            if tests
        ]
        session.add_all(shards)
        run.started_at = utcnow()
        if not shards:
            run.state, run.conclusion, run.finished_at = RunState.COMPLETED, "neutral", utcnow()
            log.info("run %s: the selector chose no test", run_id)
            return _reports(enqueue_reports(session, rt, run, "completed"))
        run.state = RunState.RUNNING
        reports = _reports(enqueue_reports(session, rt, run, "in_progress"))
        session.flush()
        log.info(
            "run %s: %d of %d tests selected in %d shard(s)",
            run_id,
            len(plan.selected),
            plan.universe_size,
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
    rt: RelayContext, head: str, base: str | None, observations: tuple[Observation, ...] = ()
) -> TestPlan:
    """The four-stage selector's plan for head against base (or head's parent)."""
    mirror = _upstream_mirror(rt)
    settings = rt.settings
    budget = Budget.parse(settings.selection_budget)
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
    )
    with mirror.tree(head) as tree:
        plan, _ = select_tests_for(tree, base, head, rt.specs, config)
    return plan


def shard_runtime(
    settings: Settings, backend: str, say: Callable[[str], None] = log.warning
) -> Isolation:
    """Where a shard's upstream code runs. Fails closed: ``auto`` takes a container when an
    engine and the runner image are there, else the bubblewrap sandbox, else refuses
    (:class:`RuntimeUnavailable`); ``local`` runs only when a person chose it
    (``CI_RELAY_RUNTIME=local``, or ``auto`` under the local demo)."""
    options = runtime_options(settings)
    if settings.runtime != "auto":
        return get_runtime(settings.runtime, backend, options=options)
    reasons = []
    for candidate in ("container", "sandbox"):
        try:
            return get_runtime(candidate, backend, options=options)
        except RuntimeUnavailable as exc:
            reasons.append(f"{candidate}: {exc}")
            say(f"runtime {candidate} unavailable: {exc}")
    if settings.local_demo:
        say("local demo: running shards WITHOUT isolation (runtime local)")
        return get_runtime("local", backend, options=options)
    raise RuntimeUnavailable(
        "no isolating runtime on this worker, so the upstream tests were not run ("
        + "; ".join(reasons)
        + "). Start Podman's socket and build the runner image (ci-relay images build), or "
        "install bubblewrap; CI_RELAY_RUNTIME=local runs upstream code unisolated, only if "
        "a person accepts that"
    )


def runtime_options(settings: Settings) -> RuntimeOptions:
    """What the runtimes need from the settings: the engine, the sandbox's user, and the
    worker's own files that a shard must never read."""
    hidden = [
        p
        for p in (
            settings.settings_file,
            settings.policy_file,
            settings.github_app_private_key_file,
            settings.data_dir,
        )
        if p is not None
    ]
    return RuntimeOptions(
        docker_host=settings.docker_host,
        sandbox_uid=settings.sandbox_uid,
        sandbox_gid=settings.sandbox_gid,
        hidden=tuple(Path(p).resolve() for p in hidden),
    )


def _upstream_mirror(rt: RelayContext) -> UpstreamMirror:
    """The bare mirror of the configured upstream, shared by every worker on this machine."""
    if rt.settings.upstream_repo is None:
        raise RuntimeError("CI_RELAY_UPSTREAM_REPO is not set: the relay has no upstream to test")
    return UpstreamMirror(rt.settings.upstream_repo, rt.settings.data_dir.resolve() / "mirrors")


def execute_shard(rt: RelayContext, shard_id: int, stale_after: timedelta) -> list[Next]:
    """Run one shard's tests through the configured runtime and store every result."""
    with rt.db.session() as session:
        claimed = claim_rows(
            session,
            update(Shard)
            .where(Shard.id == shard_id)
            .where(
                or_(
                    Shard.state == ShardState.PENDING,
                    (Shard.state == ShardState.RUNNING)
                    & (Shard.updated_at < utcnow() - stale_after),
                )
            )
            .values(
                state=ShardState.RUNNING,
                attempts=Shard.attempts + 1,
                started_at=utcnow(),
                updated_at=utcnow(),
            ),
        )
        if not claimed:
            return []
        shard = session.get(Shard, shard_id)
        assert shard is not None
        run_id, backend, head = shard.run_id, shard.run.backend, shard.run.change.head_sha
        tests = list(shard.test_files)
    settings = rt.settings
    try:
        runtime = shard_runtime(settings, backend)
        mirror = _upstream_mirror(rt)
        mirror.ensure(head)
    except (RuntimeUnavailable, CheckoutError) as exc:
        log.error("shard %s of run %s not run: %s", shard_id, run_id, exc)
        return _shard_failed(rt, shard_id, run_id, str(exc))
    with (
        mirror.tree(head) as tree,
        tempfile.TemporaryDirectory() as tmp,
        claim_device(
            backend,
            get_backend(backend).processes_per_device,
            settings.devices,
            settings.device_lock_dir,
            on_wait=lambda msg: log.info("shard %s: %s", shard_id, msg),
        ) as device,
    ):
        report = run_shard(
            runtime,
            ShardRequest(
                tests=tests,
                specs=[p.resolve() for p in rt.specs],
                upstream=tree,
                scratch=Path(tmp),
                backend=backend,
                per_test_timeout=settings.per_test_timeout,
                limits=Limits(
                    memory_mb=settings.shard_memory_mb,
                    wall_seconds=SHARD_TIMEOUT_SECONDS,
                    scratch_mb=settings.shard_scratch_mb,
                ),
                env=device.env(),
            ),
        )
    results = list(report.results.values())
    failed = any(r.outcome in BAD_OUTCOMES for r in results)
    code = 3 if report.error else (1 if failed else 0)
    output = f"runtime {runtime.name}, {report.processes} process(es)\n" + "\n".join(report.log)
    if report.error:
        output = f"{report.error}\n{output}"
    with rt.db.session() as session:
        shard = session.get(Shard, shard_id)
        assert shard is not None
        for old in shard.results:
            session.delete(old)
        session.flush()
        for case in results:
            session.add(
                TestResult(
                    shard=shard,
                    nodeid=case.nodeid,
                    outcome="flaky" if case.flaky else case.outcome,
                    mode=case.mode,
                    duration=case.duration,
                    message=case.message,
                    details=case.details or None,
                )
            )
        shard.exit_code = code
        shard.state = ShardState.DONE if code in (0, 1) else ShardState.FAILED
        shard.log_tail = output[-8000:]
        shard.runtime = runtime.name
        shard.error = report.error
        shard.finished_at = utcnow()
    log.info("shard %s of run %s finished with exit code %s", shard_id, run_id, code)
    return [Next("collect", run_id)]


def _run_failed(rt: RelayContext, run_id: int, error: str) -> list[Next]:
    """End a run that cannot be tested (an infrastructure error), and report it."""
    with rt.db.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        run.state, run.conclusion, run.error = RunState.COMPLETED, "error", error[:4000]
        run.finished_at = utcnow()
        return _reports(enqueue_reports(session, rt, run, "completed"))


def _shard_failed(rt: RelayContext, shard_id: int, run_id: int, error: str) -> list[Next]:
    """End a shard that could not run at all (an infrastructure error, shown as such)."""
    with rt.db.session() as session:
        shard = session.get(Shard, shard_id)
        assert shard is not None
        shard.state, shard.exit_code = ShardState.FAILED, 3
        shard.error, shard.log_tail = error, error
        shard.finished_at = utcnow()
    return [Next("collect", run_id)]


def collect(rt: RelayContext, run_id: int) -> list[Next]:
    """Close a run once every shard finished; queue its report in the outbox."""
    with rt.db.session() as session:
        run = session.get(Run, run_id)
        if run is None or run.state != RunState.RUNNING:
            return []
        if any(s.state in (ShardState.PENDING, ShardState.RUNNING) for s in run.shards):
            return []
        counts: dict[str, int] = {}
        for shard in run.shards:
            for result in shard.results:
                counts[result.outcome] = counts.get(result.outcome, 0) + 1
        codes = {s.exit_code for s in run.shards}
        if any(s.state == ShardState.FAILED for s in run.shards):
            conclusion = "error"
        elif 1 in codes:
            conclusion = "failure"
        else:
            conclusion = "success"
        claimed = claim_rows(
            session,
            update(Run)
            .where(Run.id == run_id, Run.state == RunState.RUNNING)
            .values(
                state=RunState.COMPLETED,
                conclusion=conclusion,
                counts=counts,
                finished_at=utcnow(),
                updated_at=utcnow(),
            ),
        )
        if claimed:
            return _reports(enqueue_reports(session, rt, run, "completed"))
    return []


def _reports(message_ids: list[int]) -> list[Next]:
    """Send steps for outbox messages just written (reporting.sender sends them)."""
    return [Next("report", pk) for pk in message_ids]


def reconcile(rt: RelayContext, older_than: timedelta, stale_after: timedelta) -> list[Next]:
    """Work the database says is pending but that may have no message: enqueue it again."""
    cutoff = utcnow() - older_than
    out: list[Next] = []
    with rt.db.session() as session:
        for pk in session.scalars(
            select(Delivery.id).where(
                Delivery.state == DeliveryState.RECEIVED,
                or_(Delivery.enqueued_at.is_(None), Delivery.enqueued_at < cutoff),
            )
        ):
            out.append(Next("process", pk))
        for run_id in session.scalars(
            select(Run.id).where(
                or_(
                    (Run.state == RunState.PENDING) & (Run.updated_at < cutoff),
                    (Run.state == RunState.SELECTING) & (Run.updated_at < utcnow() - stale_after),
                )
            )
        ):
            out.append(Next("select", run_id))
        for shard in session.scalars(
            select(Shard).where(
                or_(
                    (Shard.state == ShardState.PENDING) & (Shard.updated_at < cutoff),
                    (Shard.state == ShardState.RUNNING)
                    & (Shard.updated_at < utcnow() - stale_after),
                )
            )
        ):
            out.append(Next("execute", shard.id, shard.run.backend))
        for run in session.scalars(select(Run).where(Run.state == RunState.RUNNING)):
            if run.shards and all(
                s.state in (ShardState.DONE, ShardState.FAILED) for s in run.shards
            ):
                out.append(Next("collect", run.id))
        out.extend(_reports(due_reports(session, cutoff)))  # retries are due; or a lost send
        if out:
            session.execute(
                update(Delivery)
                .where(Delivery.id.in_([n.arg for n in out if n.task == "process"]))
                .values(enqueued_at=utcnow())
            )
    return out
