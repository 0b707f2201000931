"""Step 5 (after a run reported): triage its failing tests and send the verdict as an update.

``collect`` queues a triage for a completed run with a failed, errored or crashed test (or a
shard that could not run) once its completed report is in the outbox, so triage never delays
the first report. This step reruns at most ``triage_max_tests`` of the failing tests, batched
per check (one rerun at head, one run at the base, one on cpu, then a bisection of a longer
range for the ones the change broke), stores a verdict per test and one for the run, and
queues the run's completed report again (now carrying ``triage_verdict``).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from sqlalchemy import func, select

from ci_relay.checkouts import CheckoutError, upstream_mirror
from ci_relay.context import RelayContext
from ci_relay.execution.outcomes import BAD_OUTCOMES
from ci_relay.execution.runtimes import RuntimeUnavailable, WorkerStopping
from ci_relay.pipeline.execute import run_tests_at
from ci_relay.reporting.outbox import enqueue_reports
from ci_relay.steps import Next, claim_pending_or_stale, keep_claimed, report_steps
from ci_relay.store.models import Run, Shard, TestResult, Triage, TriageState, utcnow
from ci_relay.triage.bisect import Probe, bisect_together
from ci_relay.triage.summary import finish
from ci_relay.triage.verdict import (
    ABSENT,
    GOOD,
    ChangeFacts,
    Observed,
    classify,
    infra_signal,
    run_verdict,
)
from reuse_specs.backends import BACKENDS
from test_selection.variants import match_variants

log = logging.getLogger("ci_relay.pipeline")


def wants_triage(rt: RelayContext, run: Run) -> bool:
    """A completed run whose failures a person will ask about (not an upgrade side)."""
    if rt.settings.triage_max_tests <= 0 or run.change.kind == "upgrade":
        return False
    counts = run.counts or {}
    return run.conclusion == "error" or any(counts.get(o) for o in BAD_OUTCOMES)


def variant_on(nodeid: str, source: str, target: str) -> str:
    """The same variant instantiated for another backend: ``TestFooSPYRE::test_x_spyre_f16``
    becomes ``TestFooCPU::test_x_cpu_f16``; a plain test's id is the same everywhere."""
    parts = nodeid.split("::")
    if len(parts) != 3 or source == target:
        return nodeid
    old, new = BACKENDS[source], BACKENDS[target]
    file, cls, name = parts
    if not cls.endswith(old.class_suffix):
        return nodeid
    cls = cls[: -len(old.class_suffix)] + new.class_suffix
    pieces = name.split("_")
    for i in range(len(pieces) - 1, 0, -1):  # the device sits after the generic name
        if pieces[i] == old.device_type:
            pieces[i] = new.device_type
            break
    return f"{file}::{cls}::{'_'.join(pieces)}"


class _Checks:
    """Runs of a few tests at a commit on a backend, timed (triage's device cost)."""

    def __init__(self, rt: RelayContext, run_id: int) -> None:
        self.rt, self.run_id, self.seconds = rt, run_id, 0.0

    def outcomes(
        self, backend: str, sha: str, generic: list[str]
    ) -> tuple[dict[str, tuple[str, str | None]], str | None]:
        """nodeid -> (outcome, message) of every variant run, or why nothing ran."""
        started = time.perf_counter()
        try:
            _name, report = run_tests_at(
                self.rt,
                backend,
                sha,
                sorted(set(generic)),
                log_as=f"triage of run {self.run_id} at {sha[:12]} on {backend}",
                rerun_failures=False,
            )
        except (RuntimeUnavailable, CheckoutError, OSError) as exc:
            return {}, f"{type(exc).__name__}: {exc}"
        finally:
            self.seconds += time.perf_counter() - started
        found: dict[str, tuple[str, str | None]] = {
            r.nodeid: (r.outcome, r.message) for r in report.results.values()
        }
        return found, report.error


def _look(
    found: dict[str, tuple[str, str | None]], error: str | None, nodeid: str
) -> tuple[str | None, str | None]:
    """What one check saw of a test: its outcome, ``absent``, or None (with why)."""
    if nodeid in found:
        outcome, message = found[nodeid]
        return outcome, message
    if error and not found:
        return None, error
    return ABSENT, "not among the tests collected there"


def _load(
    rt: RelayContext, triage_id: int
) -> tuple[int, ChangeFacts, list[Observed], list[str], int]:
    with rt.db.session() as session:
        job = session.get(Triage, triage_id)
        assert job is not None
        run = job.run
        change = run.change
        limit = rt.settings.triage_max_tests
        failing = (
            select(TestResult.nodeid, TestResult.outcome, TestResult.message)
            .join(Shard, Shard.id == TestResult.shard_id)
            .where(Shard.run_id == run.id, TestResult.outcome.in_(sorted(BAD_OUTCOMES)))
        )
        rows = session.execute(failing.order_by(Shard.index, TestResult.id).limit(limit)).all()
        total = session.scalar(select(func.count()).select_from(failing.subquery())) or 0
        plan = run.selection.plan if run.selection is not None else {}
        generic = [t for shard in plan.get("shards", []) for t in shard]
        infra = [f"shard {s.index}: {s.error}" for s in run.shards if s.error]
        if run.error:
            infra.insert(0, run.error)
        facts = ChangeFacts(run.backend, change.head_sha, change.base_sha, change.number)
        run_id = run.id
    owner = {
        v: g
        for g, variants in match_variants(generic, [r[0] for r in rows]).items()
        for v in variants
    }
    observed = [
        Observed(nodeid, owner.get(nodeid, nodeid), outcome, message)
        for nodeid, outcome, message in rows
    ]
    return run_id, facts, observed, infra, max(0, total - len(rows))


def triage_run(rt: RelayContext, triage_id: int, stale_after: timedelta) -> list[Next]:
    """Run the checks for a run's failing tests, store the verdicts, queue the update."""
    with rt.db.session() as session:
        if not claim_pending_or_stale(
            session, Triage, triage_id, TriageState.PENDING, TriageState.RUNNING, stale_after
        ):
            return []
    try:
        with keep_claimed(rt, Triage, triage_id, TriageState.RUNNING, stale_after):
            facts, observed, infra, untriaged, seconds = _triage(rt, triage_id)
        tests = [classify(o, facts) for o in observed]
        verdict = finish(run_verdict(tests, infra, untriaged), rt.settings)
        state, error = TriageState.DONE, None
    except WorkerStopping:  # not triage's failure: it stays claimed and runs again
        raise
    except Exception as exc:  # never a stuck run: the verdict says triage broke
        log.exception("triage %s failed", triage_id)
        tests, seconds, state, error = [], 0.0, TriageState.FAILED, f"{type(exc).__name__}: {exc}"
        verdict = finish(
            {
                "category": "unknown",
                "confidence": "low",
                "summary": "Triage could not finish; see its evidence.",
                "suspected_upstream": None,
                "evidence": [f"triage failed: {error}"],
            },
            rt.settings,
        )
    with rt.db.session() as session:
        job = session.get(Triage, triage_id)
        assert job is not None
        job.state, job.error = state, error
        job.tests = [t.to_json() for t in tests]
        job.verdict = verdict.model_dump(mode="json")
        job.device_seconds = seconds
        job.finished_at = utcnow()
        run = job.run
        log.info(
            "triage of run %s: %s (%s), %d test(s), %.1fs of device time",
            run.id,
            verdict.category,
            verdict.confidence,
            len(tests),
            seconds,
        )
        return report_steps(enqueue_reports(session, rt, run, "completed"))


def _triage(
    rt: RelayContext, triage_id: int
) -> tuple[ChangeFacts, list[Observed], list[str], int, float]:
    run_id, facts, observed, infra, untriaged = _load(rt, triage_id)
    checks = _Checks(rt, run_id)
    mirror = upstream_mirror(rt.settings)
    if facts.base:
        try:
            mirror.ensure(facts.head)
            mirror.ensure(facts.base)
            facts = ChangeFacts(
                facts.backend,
                facts.head,
                facts.base,
                facts.number,
                frozenset(mirror.changed_files(facts.base, facts.head)),
            )
        except CheckoutError as exc:
            for o in observed:
                o.notes.append(f"the change's base is not available: {exc}")
            facts = ChangeFacts(facts.backend, facts.head, None, facts.number)
    pending = [o for o in observed if not infra_signal(o.outcome, o.message, o.nodeid, facts.files)]
    _check(checks, pending, "rerun", facts.backend, facts.head)
    pending = [o for o in pending if o.rerun in BAD_OUTCOMES]
    if facts.base:
        _check(checks, pending, "base", facts.backend, facts.base)
    if facts.backend != "cpu" and "cpu" in BACKENDS:
        _check(
            checks,
            [o for o in pending if o.base is not None],
            "cpu",
            "cpu",
            facts.head,
            facts.backend,
        )
    broke = [o for o in pending if o.base in GOOD]
    if broke and facts.base:
        commits = mirror.commits_between(facts.base, facts.head)
        if len(commits) > 1 and rt.settings.triage_bisect_steps:
            _bisect(checks, broke, facts, commits, rt.settings.triage_bisect_steps)
        elif commits == [facts.head]:  # a one-commit change: that commit is the first bad
            for o in broke:
                o.first_bad = facts.head
    return facts, observed, infra, untriaged, checks.seconds


def _check(
    checks: _Checks,
    tests: list[Observed],
    field: str,
    backend: str,
    sha: str,
    source: str | None = None,
) -> None:
    if not tests:
        return
    found, error = checks.outcomes(backend, sha, [o.generic for o in tests])
    for o in tests:
        nodeid = variant_on(o.nodeid, source, backend) if source else o.nodeid
        seen, message = _look(found, error, nodeid)
        setattr(o, field, seen)
        if message and (seen is None or seen == ABSENT or seen in BAD_OUTCOMES):
            o.notes.append(f"{field} at {sha[:12]} on {backend}: {message}"[:1000])


def _bisect(
    checks: _Checks, tests: list[Observed], facts: ChangeFacts, commits: list[str], steps: int
) -> None:
    """Name the first bad commit of each test the change broke, bisecting them together."""
    by_id = {o.nodeid: o for o in tests}

    def probe(sha: str, group: list[str]) -> dict[str, Probe]:
        found, error = checks.outcomes(facts.backend, sha, [by_id[t].generic for t in group])
        answers: dict[str, Probe] = {}
        for t in group:
            seen, _message = _look(found, error, t)
            answers[t] = "good" if seen in GOOD else "bad" if seen in BAD_OUTCOMES else "skip"
        return answers

    assert facts.base is not None
    for nodeid, found in bisect_together(facts.base, commits, list(by_id), probe, steps).items():
        o = by_id[nodeid]
        o.first_bad = found.first_bad
        if found.first_bad is None:
            o.bisect_note = f"first bad in {found.good[:12]}..{found.bad[:12]}; {found.note}"
