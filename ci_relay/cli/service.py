"""The relay as a service: ``serve``, ``worker``, ``replay``, and the one-command ``demo``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ci_relay.cli.common import (
    _configure_logging,
    _fail,
    _settings,
    err,
    out,
)

commands = typer.Typer()


def _say_demo_runtimes(backends: tuple[str, ...]) -> None:
    """Where the demo's shards will run, and why not in a container when they cannot."""
    from ci_relay.execution.choice import shard_runtime

    # the demo's relay runs with CI_RELAY_RUNTIME=auto as a local demo: a machine without
    # Podman or bubblewrap runs the sample's tests unisolated, and the run page says so
    settings = _settings(runtime="auto", local_demo=True)
    for backend in backends:
        runtime = shard_runtime(settings, backend, say=lambda msg: err.print(f"[yellow]{msg}[/]"))
        where = "local (NOT isolated)" if runtime.name == "local" else runtime.name
        out.print(f"{backend} shards run in: {where}")


@commands.command("demo")
def demo(
    workdir: Annotated[
        Path, typer.Option("--workdir", help="Where the relay's data and the sample go.")
    ] = Path(".ci-relay/demo"),
    exit_when_done: Annotated[
        bool, typer.Option("--exit-when-done", help="Stop the relay once the result is shown.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the result.")] = 600,
) -> None:
    """Start the relay on this machine (embedded mode) and feed it one sample upstream change."""
    from ci_relay.demo import new_demo, pull_request_payload, send_webhook, wait_for_run

    relay, sample = new_demo(workdir.resolve())
    log_file = relay.workdir / "relay.log"
    _stop_on_sigterm()
    out.print(f"sample upstream: {sample.path} ({len(sample.commits)} commits)")
    _say_demo_runtimes(relay.backends)
    relay.start(sample, log_file)
    try:
        with err.status(f"starting the relay on {relay.url} (log: {log_file})…"):
            relay.wait_ready()
        payload = pull_request_payload(sample, head_index=len(sample.commits) - 2)
        response = send_webhook(relay.url, relay.secret, "pull_request", payload)
        ack = response.json()
        out.print(
            f"sent pull_request #{payload['number']} (head {payload['after'][:12]}: "
            f"{payload['pull_request']['title']}) -> HTTP {response.status_code} {ack}"
        )
        if response.status_code != 202:
            raise _fail("the relay did not accept the webhook", 1)
        with err.status("selecting and running the upstream tests…"):
            change = wait_for_run(relay.url, ack["delivery_id"], timeout)
        for run in change["runs"]:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(run["counts"].items()))
            out.print(
                f"run {run['id']} on {run['backend']} ({run['level']}): "
                f"[bold]{run['conclusion']}[/] — {counts}"
            )
            out.print(f"results: {relay.url}/runs/{run['id']}   (JSON: /api/runs/{run['id']})")
        out.print(f"dashboard: {relay.url}/")
        out.print(f"commit: {relay.url}/commits/{payload['after']}")
        out.print(f"changes: {relay.url}/api/changes   deliveries: {relay.url}/api/deliveries")
        if not exit_when_done:
            out.print("the relay keeps running; press Ctrl-C to stop it")
            assert relay.process is not None
            relay.process.wait()
    except KeyboardInterrupt:
        pass
    except (TimeoutError, RuntimeError) as exc:
        raise _fail(f"{exc} (see {log_file})", 1) from None
    finally:
        relay.stop()


def _stop_on_sigterm() -> None:
    """SIGTERM (a service manager, ``kill``) stops the demo as Ctrl-C does, so its relay, the
    relay's worker and the worker's shards are stopped too instead of being orphaned."""
    import signal

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


@commands.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    worker: Annotated[
        bool | None,
        typer.Option(
            "--worker/--no-worker",
            help="Start a worker with the API (default: yes with the embedded broker).",
        ),
    ] = None,
    local_demo: Annotated[
        bool, typer.Option("--local-demo", help="Allow unsigned webhooks (local demo only).")
    ] = False,
) -> None:
    """Run the relay's API (webhooks, JSON API, /healthz, /readyz, /metrics)."""
    from ci_relay.service.processes import ServiceError
    from ci_relay.service.processes import serve as run_server

    settings = _settings(local_demo=True if local_demo else None)
    _configure_logging()
    try:
        run_server(settings, host, port, settings.embedded_broker if worker is None else worker)
    except ServiceError as exc:
        raise _fail(str(exc)) from None


@commands.command("worker")
def worker(
    queues: Annotated[
        str | None,
        typer.Option(help="Comma-separated queues (default: all; exec.<backend> for one device)."),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Tasks at once.")] = 2,
    reconcile_every: Annotated[float, typer.Option(help="Seconds between reconciler passes.")] = 15,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve this worker's Prometheus metrics on this port.")
    ] = None,
) -> None:
    """Run a Celery worker for the relay's queues, with the reconciler."""
    from ci_relay.service.processes import all_queues, run_worker

    _configure_logging()
    run_worker(_settings(), queues or all_queues(), concurrency, reconcile_every, metrics_port)


@commands.command("replay")
def replay(
    source: Annotated[str, typer.Argument(help="A stored delivery id, or a JSON payload file.")],
    event: Annotated[
        str | None, typer.Option(help="Event name for a payload file (X-GitHub-Event).")
    ] = None,
) -> None:
    """Re-inject a stored or saved delivery as a new delivery and queue it."""
    from ci_relay.replay import ReplayError, replay_delivery

    try:
        pk = replay_delivery(_settings(), source, event)
    except ReplayError as exc:
        raise _fail(str(exc)) from None
    out.print(f"queued as delivery {pk}")


@commands.command("nightly")
def nightly() -> None:
    """Start the nightly now (the branch head as CRCR's nightly), whatever the clock says;
    the reconciler starts it daily at CI_RELAY_NIGHTLY_AT by itself."""
    from ci_relay.nightly import nightly_steps
    from ci_relay.service.tasks import configure, enqueue

    rt = configure(_settings())
    try:
        steps = nightly_steps(rt, force=True)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if not steps:
        raise _fail("no nightly started: the branch is unknown or unchanged since the last one")
    enqueue(steps)
    out.print(f"nightly queued as delivery {steps[0].arg}")
