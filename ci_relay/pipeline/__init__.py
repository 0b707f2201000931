"""The relay's steps as plain functions over the database: deliveries -> changes -> runs ->
results, one module per step (``process``, ``select``, ``execute``, ``collect``; ``upgrade``
for a release upgrade job, ``triage`` after a run with failures) and the ``reconcile`` sweep.

Each step is idempotent and claims its row with a conditional update, so a duplicated or
redelivered task does nothing twice; the Celery tasks in :mod:`ci_relay.service.tasks` only
call these and enqueue the :class:`ci_relay.steps.Next` they return.
"""

from datetime import timedelta

from ci_relay.context import RelayContext
from ci_relay.pipeline.collect import collect
from ci_relay.pipeline.execute import execute_shard
from ci_relay.pipeline.process import process_delivery
from ci_relay.pipeline.reconcile import reconcile
from ci_relay.pipeline.select import past_observations, select_tests
from ci_relay.pipeline.trace import delivery_id_of
from ci_relay.pipeline.triage import triage_run
from ci_relay.pipeline.upgrade import plan_upgrade_job
from ci_relay.steps import Next

STALE = timedelta(hours=1)  # a claimed row older than this is taken over (in-process runs)


def run_step(rt: RelayContext, step: Next, stale: timedelta = STALE) -> list[Next]:
    """One pipeline step run in this process, as a worker runs it: the steps it queues. For
    the in-process drains of tests and benches; the service's Celery tasks call the steps
    themselves (each on its own queue). A ``report`` step is the outbox sender's, not the
    pipeline's: it is refused here like any name that is not a step."""
    match step.task:
        case "process":
            return process_delivery(rt, step.arg)
        case "select":
            return select_tests(rt, step.arg, stale)
        case "upgrade":
            return plan_upgrade_job(rt, step.arg, stale)
        case "execute":
            return execute_shard(rt, step.arg, stale)
        case "collect":
            return collect(rt, step.arg)
        case "triage":
            return triage_run(rt, step.arg, stale)
    raise ValueError(f"no step named {step.task!r}")


__all__ = [
    "collect",
    "delivery_id_of",
    "execute_shard",
    "past_observations",
    "plan_upgrade_job",
    "process_delivery",
    "reconcile",
    "run_step",
    "select_tests",
    "triage_run",
]
