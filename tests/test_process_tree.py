"""SIGTERM to ``ci-relay demo`` (the process alone, not its group, as a service manager or
``kill PID`` sends it) stops the whole tree it started: the relay, the relay's embedded
worker, and the shards running at that moment (processes or containers). Issue 27, item 4."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ci_relay.execution.runtimes import PODMAN_SOCKET
from ci_relay.execution.runtimes.container import shard_containers


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every live (not zombie) process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            found[int(entry.name)] = (int(ppid), cmdline)
    return found


def _descendants(root: int) -> dict[int, str]:
    table = _processes()
    out: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, cmdline) in table.items():
            if ppid == parent and pid not in out:
                out[pid] = cmdline
                frontier.append(pid)
    return out


def _engine_containers(owners: set[int]) -> list[str]:
    """Names of shard containers whose owner is one of ``owners`` (none without an engine)."""
    import docker

    try:
        client = docker.DockerClient(base_url=PODMAN_SOCKET, timeout=30)
        try:
            listed = shard_containers(client)
        finally:
            client.close()
    except docker.errors.DockerException:  # no engine here: no container of ours either
        return []
    return [
        c.name for c in listed if c.owner.count(":") == 2 and int(c.owner.split(":")[1]) in owners
    ]


@pytest.mark.slow
def test_sigterm_to_the_demo_leaves_no_process_or_shard_behind(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CI_RELAY_")}
    log = tmp_path / "demo.out"
    with log.open("w") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "ci_relay", "demo", "--workdir", str(tmp_path / "demo")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "COLUMNS": "200"},
        )
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 300
    running_shard = None
    try:
        while running_shard is None and time.monotonic() < deadline:
            assert demo.poll() is None, log.read_text()
            seen.update(_descendants(demo.pid))
            shard_processes = [c for c in seen.values() if "ci_relay.execution.shard_child" in c]
            if shard_processes:
                running_shard = shard_processes[0]
            elif containers := _engine_containers(set(seen)):
                running_shard = containers[0]
            time.sleep(0.2)
        assert running_shard, "no shard ever ran:\n" + log.read_text()
        seen.update(_descendants(demo.pid))
        demo.send_signal(signal.SIGTERM)  # the process, not its group
        demo.wait(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    survivors: dict[int, str] = {}
    containers: list[str] = []
    until = time.monotonic() + 60  # the relay waits for its worker, the worker for its shards
    while time.monotonic() < until:
        alive = _processes()
        survivors = {pid: cmd for pid, cmd in seen.items() if alive.get(pid, (0, ""))[1] == cmd}
        containers = _engine_containers(set(seen))
        if not survivors and not containers:
            break
        time.sleep(0.5)
    relay_log = (tmp_path / "demo" / "relay.log").read_text()[-3000:]
    assert survivors == {}, relay_log
    assert containers == [], relay_log
    assert "relay keeps running" not in log.read_text()  # stopped mid-run, not after it


def test_a_stopping_worker_kills_its_sandbox_and_local_shard_trees(tmp_path: Path) -> None:
    """What the worker's shutdown hook does for shards that are processes, not containers:
    the running tree (a shard and a grandchild it started) is killed at once, the shard's
    call ends with WorkerStopping (no conclusion from a killed shard), and no new one starts.
    In a child interpreter: the stop is final for the process that calls it."""
    code = f"""
import subprocess, sys, threading, time
from pathlib import Path
from ci_relay.execution.runtimes.process import Limits, WorkerStopping, _run, stop_shard_processes
scratch = Path({str(tmp_path)!r})
argv = ["sh", "-c", "sleep 600 & echo grandchild $!; wait"]
ended = []
def shard():
    try:
        ended.append(_run(argv, {{"PATH": "/usr/bin:/bin"}}, scratch, Limits(), scratch))
    except WorkerStopping as exc:
        ended.append(exc)
thread = threading.Thread(target=shard)
thread.start()
time.sleep(2)
started = time.monotonic()
print("killed", stop_shard_processes())
thread.join(30)
print("ended", type(ended[0]).__name__, round(time.monotonic() - started) < 10)
try:
    _run(["true"], {{}}, scratch, Limits(), scratch)
except WorkerStopping as exc:
    print("next", exc)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "killed 1"
    assert lines[1] == "ended WorkerStopping True"
    assert lines[2] == "next the worker is shutting down: no new shard process"
    assert not [c for _, c in _processes().values() if c.startswith("sleep 600")]
