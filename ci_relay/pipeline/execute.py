"""Step 3: one shard's tests run in the isolation runtime the settings allow, on a claimed
device slot, and every result is stored as it comes (the worker holds none of them: a
25k-variant shard's failure texts go to the database, not into its memory)."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from sqlalchemy import delete

from ci_relay.checkouts import CheckoutError, upstream_mirror
from ci_relay.context import RelayContext
from ci_relay.coverage_maps import records_coverage, store_shard_map
from ci_relay.execution.choice import shard_runtime
from ci_relay.execution.devices import claim_device
from ci_relay.execution.outcomes import BAD_OUTCOMES
from ci_relay.execution.runtimes import Limits, RuntimeUnavailable
from ci_relay.execution.shard import OnResults, ShardReport, ShardRequest, run_shard
from ci_relay.execution.spec_run import TestOutcome
from ci_relay.steps import Next, claim_pending_or_stale, keep_claimed
from ci_relay.store.models import (
    Shard,
    ShardState,
    TestResult,
    utcnow,
)
from reuse_specs.backends import get_backend

log = logging.getLogger("ci_relay.pipeline")


SHARD_TIMEOUT_SECONDS = 3600
REPLACE_BATCH = 500  # node ids per DELETE ... IN (...) (SQLite's variable limit)


def execute_shard(rt: RelayContext, shard_id: int, stale_after: timedelta) -> list[Next]:
    """Run one shard's tests through the configured runtime and store every result."""
    with rt.db.session() as session:
        claimed = claim_pending_or_stale(
            session,
            Shard,
            shard_id,
            ShardState.PENDING,
            ShardState.RUNNING,
            stale_after,
            attempts=Shard.attempts + 1,
            started_at=utcnow(),
        )
        if not claimed:
            return []
        shard = session.get(Shard, shard_id)
        assert shard is not None
        run_id, backend, head = shard.run_id, shard.run.backend, shard.run.change.head_sha
        repository, kind = shard.run.change.repository, shard.run.change.kind
        tests = list(shard.test_files)
        label = rt.policy.label_for(shard.run.change.repository, backend)
        # an earlier attempt's (a worker that died mid-shard): this attempt stores its own
        session.execute(delete(TestResult).where(TestResult.shard_id == shard_id))
    try:
        with keep_claimed(rt, Shard, shard_id, ShardState.RUNNING, stale_after):
            runtime_name, report = run_tests_at(
                rt,
                backend,
                head,
                tests,
                log_as=f"shard {shard_id}",
                rerun_failures=True,
                on_results=lambda found: _store_streamed(rt, shard_id, found),
                label=label,
                on_coverage=(
                    (
                        lambda streams, error: store_shard_map(
                            rt, shard_id, streams, repository, head, backend, error
                        )
                    )
                    if records_coverage(rt, kind, backend)
                    else None
                ),
            )
    except (RuntimeUnavailable, CheckoutError) as exc:
        log.error("shard %s of run %s not run: %s", shard_id, run_id, exc)
        return _shard_failed(rt, shard_id, run_id, str(exc))
    failed = any(report.counts[outcome] for outcome in BAD_OUTCOMES)
    code = 3 if report.error else (1 if failed else 0)
    output = f"runtime {runtime_name}, {report.processes} process(es)\n" + "\n".join(report.log)
    if report.error:
        output = f"{report.error}\n{output}"
    with rt.db.session() as session:
        shard = session.get(Shard, shard_id)
        assert shard is not None
        shard.exit_code = code
        shard.state = ShardState.DONE if code in (0, 1) else ShardState.FAILED
        shard.log_tail = output[-8000:]
        shard.runtime = runtime_name
        shard.error = report.error
        shard.finished_at = utcnow()
    log.info("shard %s of run %s finished with exit code %s", shard_id, run_id, code)
    return [Next("collect", run_id)]


def _row(shard: Shard, case: TestOutcome) -> TestResult:
    return TestResult(
        shard=shard,
        nodeid=case.nodeid,
        outcome="flaky" if case.flaky else case.outcome,
        mode=case.mode,
        duration=case.duration,
        message=case.message,
        details=case.details or None,
        note=case.note or None,
    )


def _store_streamed(rt: RelayContext, shard_id: int, found: list[TestOutcome]) -> None:
    """Results of a running shard, stored as they come (the dashboard shows them at once).
    A later result for a test replaces its earlier one (a rerun's flaky verdict, a crash
    recorded after the test logged its result)."""
    latest = {case.nodeid: case for case in found}
    with rt.db.session() as session:
        shard = session.get(Shard, shard_id)
        if shard is None or shard.state != ShardState.RUNNING:
            return
        nodeids = list(latest)
        for start in range(0, len(nodeids), REPLACE_BATCH):
            session.execute(
                delete(TestResult).where(
                    TestResult.shard_id == shard_id,
                    TestResult.nodeid.in_(nodeids[start : start + REPLACE_BATCH]),
                )
            )
        session.add_all(_row(shard, case) for case in latest.values())


def run_tests_at(
    rt: RelayContext,
    backend: str,
    sha: str,
    tests: list[str],
    *,
    log_as: str,
    rerun_failures: bool,
    on_results: OnResults | None = None,
    label: str | None = None,
    on_coverage: Callable[[list[Path], str | None], object] | None = None,
) -> tuple[str, ShardReport]:
    """Run generic ``tests`` at upstream ``sha`` on ``backend`` in the runtime the settings
    allow, holding a device slot: a shard's work, and triage's reruns. With ``on_coverage``
    the tests record their per-test coverage, handed over (the shard's stream files, and its
    error when it failed) before the scratch folder goes. Raises
    :class:`RuntimeUnavailable` or :class:`CheckoutError` when they cannot run at all."""
    settings = rt.settings
    runtime = shard_runtime(settings, backend)
    mirror = upstream_mirror(settings)
    mirror.ensure(sha)
    with (
        mirror.tree(sha) as tree,
        tempfile.TemporaryDirectory() as tmp,
        claim_device(
            backend,
            get_backend(backend).processes_per_device,
            settings.devices,
            settings.device_lock_dir,
            on_wait=lambda msg: log.info("%s: %s", log_as, msg),
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
                rerun_failures=rerun_failures,
                label=label,
                record_coverage=on_coverage is not None,
            ),
            on_results=on_results,
        )
        if on_coverage is not None:
            try:
                on_coverage(report.coverage_streams, report.error)
            except Exception:  # the map is evidence for later; the shard's results stand
                log.exception("%s: its coverage map was not stored", log_as)
    return runtime.name, report


def _shard_failed(rt: RelayContext, shard_id: int, run_id: int, error: str) -> list[Next]:
    """End a shard that could not run at all (an infrastructure error, shown as such)."""
    with rt.db.session() as session:
        shard = session.get(Shard, shard_id)
        assert shard is not None
        shard.state, shard.exit_code = ShardState.FAILED, 3
        shard.error, shard.log_tail = error, error
        shard.finished_at = utcnow()
    return [Next("collect", run_id)]
