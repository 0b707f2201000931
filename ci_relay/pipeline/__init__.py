"""The relay's steps as plain functions over the database: deliveries -> changes -> runs ->
results, one module per step (``process``, ``select``, ``execute``, ``collect``; ``upgrade``
for a release upgrade job, ``triage`` after a run with failures) and the ``reconcile`` sweep.

Each step is idempotent and claims its row with a conditional update, so a duplicated or
redelivered task does nothing twice; the Celery tasks in :mod:`ci_relay.service.tasks` only
call these and enqueue the :class:`ci_relay.steps.Next` they return.
"""

from ci_relay.pipeline.collect import collect
from ci_relay.pipeline.execute import execute_shard
from ci_relay.pipeline.process import process_delivery
from ci_relay.pipeline.reconcile import reconcile
from ci_relay.pipeline.select import past_observations, select_tests
from ci_relay.pipeline.trace import delivery_id_of
from ci_relay.pipeline.triage import triage_run
from ci_relay.pipeline.upgrade import plan_upgrade_job

__all__ = [
    "collect",
    "delivery_id_of",
    "execute_shard",
    "past_observations",
    "plan_upgrade_job",
    "process_delivery",
    "reconcile",
    "select_tests",
    "triage_run",
]
