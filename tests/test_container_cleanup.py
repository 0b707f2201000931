"""Shard containers do not outlive their worker: a worker that starts shutting down stops
its running ones (and exits removing any left), and one killed outright (SIGKILL) leaves them
to the next worker on the host, which removes them at start. Real Podman, the cpu runner image; the worker is a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import docker
from ci_relay.execution.runtimes import PODMAN_SOCKET
from ci_relay.execution.runtimes.container import (
    ContainerRuntime,
    ShardContainer,
    owner_alive,
    process_owner,
    reap_orphaned_containers,
    shard_containers,
)

# A stand-in worker: one shard container sleeping in a thread, then (mode "exit") a normal
# interpreter exit once it runs, or (mode "wait") nothing until it is killed.
WORKER = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    import docker
    from ci_relay.execution.runtimes import Invocation, Limits, PODMAN_SOCKET
    from ci_relay.execution.runtimes.container import (
        ContainerRuntime, process_owner, shard_containers,
    )

    root, mode = Path(sys.argv[1]), sys.argv[2]
    (root / "up").mkdir(exist_ok=True)
    inv = Invocation(["python", "-c", "import time; time.sleep(600)"], root / "up",
                     root / "scratch", limits=Limits(wall_seconds=900, scratch_mb=16))
    ended = []

    def shard():
        try:
            ended.append(ContainerRuntime("cpu").run(inv))
        except Exception as exc:
            ended.append(exc)

    thread = threading.Thread(target=shard, daemon=True)
    thread.start()
    client = docker.DockerClient(base_url=PODMAN_SOCKET)
    while not any(c.state == "running" for c in shard_containers(client, process_owner())):
        time.sleep(0.2)
    print("running", flush=True)
    if mode == "wait":
        time.sleep(600)
    if mode == "stop":  # what the worker does when Celery's shutdown begins
        from ci_relay.execution.runtimes.container import stop_shard_containers
        print("stopped", stop_shard_containers(), flush=True)
        thread.join(120)
        print("shard ended with", type(ended[0]).__name__, ended[0], flush=True)
        try:
            ContainerRuntime("cpu").run(inv)
        except Exception as exc:
            print("next shard:", type(exc).__name__, exc, flush=True)
    """
)


@pytest.fixture
def engine() -> Iterator[Any]:
    client = docker.DockerClient(base_url=PODMAN_SOCKET, timeout=60)
    try:
        client.images.get(ContainerRuntime("cpu").image)  # of this checkout's sources
    except docker.errors.ImageNotFound:
        pytest.fail("the cpu runner image is missing: ci-relay images build (.ci/run builds it)")
    yield client
    client.close()


def _owned_by(client: Any, pid: int) -> list[ShardContainer]:
    return [c for c in shard_containers(client) if c.owner.split(":")[1] == str(pid)]


def _start_worker(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(tmp_path), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "running"  # its container runs
    return proc


def test_a_worker_that_exits_removes_its_running_containers(engine: Any, tmp_path: Path) -> None:
    proc = _start_worker(tmp_path, "exit")
    assert proc.wait(timeout=120) == 0
    assert _owned_by(engine, proc.pid) == []


def test_a_stopping_worker_stops_its_shards_without_a_verdict(engine: Any, tmp_path: Path) -> None:
    """Shutdown does not wait hours for a shard: its container goes at once, the shard ends
    with WorkerStopping (not a result: the reconciler runs it again), and no new one starts."""
    proc = _start_worker(tmp_path, "stop")
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    lines = out.splitlines()
    assert lines[0] == "stopped 1"
    assert lines[1].startswith("shard ended with WorkerStopping the worker is shutting down")
    assert lines[2].startswith("next shard: WorkerStopping the worker is shutting down")
    assert _owned_by(engine, proc.pid) == []


def test_a_killed_workers_containers_are_removed_by_the_next_one(
    engine: Any, tmp_path: Path
) -> None:
    proc = _start_worker(tmp_path, "wait")
    try:
        (container,) = _owned_by(engine, proc.pid)
        assert owner_alive(container.owner) is True
        assert container.name not in reap_orphaned_containers()  # its owner still runs
        assert [c.id for c in _owned_by(engine, proc.pid)] == [container.id]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    (left,) = _owned_by(engine, proc.pid)  # SIGKILL runs no cleanup: the container stays
    assert left.state == "running"
    assert owner_alive(left.owner) is False
    assert container.name in reap_orphaned_containers()
    assert _owned_by(engine, proc.pid) == []


def test_owner_labels_name_one_process() -> None:
    """host:pid:start; a reused pid (another start time), another host's label or a label
    this code did not write are never taken for a dead owner of this host."""
    mine = process_owner()
    host, pid, start = mine.split(":")
    assert pid == str(os.getpid()) and start.isdigit()
    assert owner_alive(mine) is True
    assert owner_alive(f"{host}:{pid}:{int(start) + 1}") is False  # the pid was reused
    assert owner_alive(f"another-host:{pid}:{start}") is None
    assert owner_alive("garbage") is None
    ended = subprocess.run(
        [sys.executable, "-c", "from ci_relay.execution.runtimes.container import "
         "process_owner; print(process_owner())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert owner_alive(ended.stdout.strip()) is False  # it has exited
