"""Celery tasks: thin wrappers that run a pipeline step and enqueue what it returns.

Short work (intake, select, report) and long work per backend (``exec.<backend>``)
use separate queues so a worker only takes work its machine can do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import Celery
from prometheus_client import Counter, Histogram
from sqlalchemy.exc import OperationalError

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.execution.runtimes import WorkerStopping
from ci_relay.logs import delivery_context
from ci_relay.nightly import nightly_steps
from ci_relay.reporting import sender
from ci_relay.settings import Settings
from ci_relay.steps import Next

log = logging.getLogger("ci_relay.service.tasks")

celery_app = Celery("ci_relay")
TASK_SECONDS = Histogram(
    "ci_relay_task_seconds",
    "Pipeline step durations in the worker",
    ["task"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600),
)
TASKS = Counter("ci_relay_tasks_total", "Pipeline steps run, by outcome", ["task", "outcome"])
SHORT_QUEUES = ("intake", "select", "report")
# reruns on the backends: a worker with the devices takes it, beside its exec.<backend> queue
TRIAGE_QUEUE = "triage"
_runtime: RelayContext | None = None


def exec_queue(backend: str) -> str:
    return f"exec.{backend}"


def configure(settings: Settings) -> RelayContext:
    """Point the Celery app and the pipeline at these settings (call once per process)."""
    global _runtime
    _runtime = RelayContext(settings)
    transport: dict[str, Any] = {"visibility_timeout": settings.task_visibility_timeout}
    if settings.embedded_broker:
        folder = settings.broker_folder
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        transport.update(
            control_folder=str(folder / "control"),  # kombu's default is ./control (the cwd)
            data_folder_in=str(folder / "queue"),
            data_folder_out=str(folder / "queue"),
            processed_folder=str(folder / "processed"),
            store_processed=False,
        )
    celery_app.close()  # drop connections made under earlier settings (tests reconfigure)
    celery_app.amqp._producer_pool = None
    celery_app.conf.update(
        broker_url=settings.effective_broker_url,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue="intake",
        worker_hijack_root_logger=False,
        task_routes={
            "relay.process_delivery": {"queue": "intake"},
            "relay.select": {"queue": "select"},
            "relay.upgrade": {"queue": "select"},
            "relay.collect": {"queue": "report"},
            "relay.send_report": {"queue": "report"},
            "relay.triage": {"queue": TRIAGE_QUEUE},
        },
    )
    return _runtime


def runtime() -> RelayContext:
    return _runtime if _runtime is not None else configure(Settings())


def enqueue(steps: list[Next]) -> None:
    """Send follow-up tasks; a broker failure is logged, the reconciler re-sends later."""
    for step in steps:
        try:
            if step.task == "process":
                process_delivery.apply_async((step.arg,), queue="intake")
            elif step.task == "select":
                select_tests.apply_async((step.arg,), queue="select")
            elif step.task == "upgrade":
                plan_upgrade.apply_async((step.arg,), queue="select")
            elif step.task == "execute":
                execute_shard.apply_async((step.arg,), queue=exec_queue(step.backend or "cpu"))
            elif step.task == "collect":
                collect.apply_async((step.arg,), queue="report")
            elif step.task == "triage":
                triage.apply_async((step.arg,), queue=TRIAGE_QUEUE)
            elif step.task == "report":
                send_report.apply_async((step.arg,), queue="report")
        except Exception:  # broker down: the database still says what is pending
            log.exception("could not enqueue %s %s; the reconciler will retry", step.task, step.arg)


def _stale() -> timedelta:
    """How long a claimed selection or upgrade plan (no heartbeat) may take before another
    worker takes it over: as long as the broker would keep its message."""
    return timedelta(seconds=runtime().settings.task_visibility_timeout)


def _silent() -> timedelta:
    """How long a running shard or triage may go without its worker's heartbeat before
    another worker takes it over: a killed exec worker's shard runs again within minutes, not
    when the broker's visibility timeout (hours) gives its message back."""
    settings = runtime().settings
    return timedelta(seconds=min(settings.claim_stale_seconds, settings.task_visibility_timeout))


RETRY: dict[str, Any] = {
    "autoretry_for": (OperationalError,),
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "max_retries": 10,
}


def _step(task: str, pk: int, body: Callable[[], list[Next]]) -> None:
    """Run one pipeline step with its delivery id on every log line, timed for metrics."""
    started = time.perf_counter()
    outcome = "ok"
    try:
        with delivery_context(pipeline.delivery_id_of(runtime(), task, pk)):
            enqueue(body())
    except WorkerStopping as exc:  # no conclusion: the row stays claimed, then goes stale
        outcome = "stopped"
        log.warning("%s %s interrupted: %s; the reconciler runs it again", task, pk, exc)
    except Exception:
        outcome = "error"
        raise
    finally:
        TASK_SECONDS.labels(task).observe(time.perf_counter() - started)
        TASKS.labels(task, outcome).inc()


@celery_app.task(name="relay.process_delivery", **RETRY)
def process_delivery(delivery_pk: int) -> None:
    _step("process", delivery_pk, lambda: pipeline.process_delivery(runtime(), delivery_pk))


@celery_app.task(name="relay.select", **RETRY)
def select_tests(run_id: int) -> None:
    _step("select", run_id, lambda: pipeline.select_tests(runtime(), run_id, _stale()))


@celery_app.task(name="relay.upgrade", **RETRY)
def plan_upgrade(upgrade_id: int) -> None:
    _step("upgrade", upgrade_id, lambda: pipeline.plan_upgrade_job(runtime(), upgrade_id, _stale()))


@celery_app.task(name="relay.execute_shard", **RETRY)
def execute_shard(shard_id: int) -> None:
    _step("execute", shard_id, lambda: pipeline.execute_shard(runtime(), shard_id, _silent()))


@celery_app.task(name="relay.collect", **RETRY)
def collect(run_id: int) -> None:
    _step("collect", run_id, lambda: pipeline.collect(runtime(), run_id))


@celery_app.task(name="relay.triage", **RETRY)
def triage(triage_id: int) -> None:
    _step("triage", triage_id, lambda: pipeline.triage_run(runtime(), triage_id, _silent()))


# A retry due within this many seconds is queued with a countdown; a later one is left to
# the reconciler, which finds it in the outbox when it is due (nothing waits in memory long).
REPORT_COUNTDOWN_MAX = 300


@celery_app.task(name="relay.send_report", **RETRY)
def send_report(message_id: int) -> None:
    """Send one outbox message (see ci_relay.reporting.sender); the row records the outcome."""

    def body() -> list[Next]:
        attempt = sender.deliver(runtime(), message_id)
        if attempt.retry_in is not None and attempt.retry_in <= REPORT_COUNTDOWN_MAX:
            try:
                send_report.apply_async((message_id,), queue="report", countdown=attempt.retry_in)
            except Exception:  # the row is pending and due: the reconciler sends it
                log.exception("could not queue the retry of report %s", message_id)
        return [Next("report", pk) for pk in attempt.unblocked]

    _step("report", message_id, body)


def reconcile_once() -> int:
    """One pass of the clock: pending work re-sent, and today's nightly started when due."""
    rt = runtime()
    steps = pipeline.reconcile(
        rt,
        older_than=timedelta(seconds=rt.settings.reconcile_after_seconds),
        stale_after=_stale(),
        silent_after=_silent(),
    )
    steps += nightly_steps(rt)
    enqueue(steps)
    return len(steps)


def start_reconciler(every_seconds: float) -> threading.Event:
    """Re-enqueue pending work periodically in a daemon thread; set the event to stop."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_seconds):
            try:
                count = reconcile_once()
                if count:
                    log.info("reconciler re-enqueued %d step(s)", count)
            except Exception:
                log.exception("reconciler pass failed")

    threading.Thread(target=loop, name="ci-relay-reconciler", daemon=True).start()
    return stop
