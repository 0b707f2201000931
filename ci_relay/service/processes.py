"""Starting the relay: the API server, workers, and the embedded one-machine mode."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ci_relay.settings import Settings

log = logging.getLogger("ci_relay.service.processes")


class ServiceError(RuntimeError):
    pass


def check_can_serve(settings: Settings) -> None:
    if settings.webhook_secret is None and not settings.local_demo:
        raise ServiceError(
            "no webhook secret: set CI_RELAY_WEBHOOK_SECRET, or pass --local-demo "
            "(accepts unsigned webhooks; for a local demo only)"
        )


def broker_reachable(settings: Settings) -> bool:
    from ci_relay.service.tasks import celery_app

    if settings.embedded_broker:
        return settings.broker_folder.is_dir()
    try:
        with celery_app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=2)
        return True
    except Exception:
        return False


def die_with_parent() -> None:
    """Linux: the embedded worker gets SIGTERM when the API process ends, however it ends.

    uvicorn re-raises the signal that stopped it, so cleanup code after it never runs.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@contextmanager
def worker_process(
    queues: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``ci-relay worker`` child process, stopped (warm shutdown) on exit."""
    cmd = [sys.executable, "-m", "ci_relay", "worker", "--queues", queues]
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, preexec_fn=die_with_parent)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def serve(settings: Settings, host: str, port: int, with_worker: bool) -> None:
    """Run the API (and, in embedded mode, a worker child) until interrupted."""
    import uvicorn

    from ci_relay.service.app import create_app
    from ci_relay.service.publisher import BackgroundPublisher
    from ci_relay.service.tasks import configure, enqueue

    check_can_serve(settings)
    rt = configure(settings)
    rt.db.upgrade()
    publisher = BackgroundPublisher(enqueue)
    app = create_app(rt, publisher.submit, lambda: broker_reachable(settings))
    log.info("ci-relay API on http://%s:%d (database %s)", host, port, rt.db.engine.url)
    try:
        if with_worker:
            with worker_process(all_queues()):
                uvicorn.run(app, host=host, port=port, log_level="warning")
        else:
            uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        publisher.close()


def all_queues() -> str:
    from ci_relay.service.tasks import SHORT_QUEUES, TRIAGE_QUEUE, exec_queue
    from reuse_specs.backends import BACKENDS

    return ",".join([*SHORT_QUEUES, TRIAGE_QUEUE, *(exec_queue(b) for b in BACKENDS)])


def _stop_shards(**_: object) -> None:
    """Celery's shutdown began (SIGTERM, Ctrl-C, or the API of ``serve`` going away):
    stop the running shard containers and shard process trees (sandbox, local) instead of
    waiting for shards that may take hours. Their tasks end without a conclusion; the
    reconciler runs those shards again."""
    from ci_relay.execution.runtimes.container import stop_shard_containers
    from ci_relay.execution.runtimes.process import stop_shard_processes

    stopped = stop_shard_containers()
    if stopped:
        log.warning("worker stopping: removed %d running shard container(s)", stopped)
    killed = stop_shard_processes()
    if killed:
        log.warning("worker stopping: killed %d running shard process tree(s)", killed)


def _reap_orphaned_shards(settings: Settings) -> None:
    """Shard containers a killed worker of this host left running cost memory and a device:
    remove them before taking new work (their shards are resumed by the reconciler)."""
    if settings.runtime not in ("auto", "container"):
        return
    from ci_relay.execution.runtimes.container import reap_orphaned_containers

    try:
        removed = reap_orphaned_containers(settings.docker_host)
    except Exception as exc:  # no engine here: nothing of ours can be running in it
        log.info("no orphaned shard containers checked (%s)", type(exc).__name__)
        return
    if removed:
        log.warning(
            "removed %d shard container(s) a stopped worker left: %s",
            len(removed),
            ", ".join(removed),
        )


def run_worker(
    settings: Settings,
    queues: str,
    concurrency: int,
    reconcile_every: float,
    metrics_port: int | None = None,
) -> None:
    """A Celery worker on the given queues, with the reconciler running beside it."""
    from celery.signals import worker_shutting_down
    from prometheus_client import start_http_server

    from ci_relay.service.tasks import celery_app, configure, start_reconciler

    # ``kill -USR1`` prints every thread's stack to stderr: where a stuck worker is
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if metrics_port:
        start_http_server(metrics_port, addr="127.0.0.1")  # task durations and outcomes
    rt = configure(settings)
    rt.db.upgrade()
    _reap_orphaned_shards(settings)
    worker_shutting_down.connect(_stop_shards, weak=False)
    stop = start_reconciler(reconcile_every)
    try:
        celery_app.worker_main(
            [
                "worker",
                "--queues",
                queues,
                "--pool",
                "threads",
                "--concurrency",
                str(concurrency),
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--hostname",
                f"ci-relay-{os.getpid()}@%h",
            ]
        )
    finally:
        stop.set()
