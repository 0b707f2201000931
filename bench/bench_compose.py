"""The production compose stack, up for real on this machine (issue 27, item 2).

Brings `docker/compose.yaml` + `docker/compose.local.yaml` up with podman-compose (every image
built here: the relay, the spyre-emu runner, and Redis and PostgreSQL from Debian's packages),
pointed at the sample upstream, then:

1. sends a signed pull_request webhook and waits for its run (two shards, one exec worker);
2. scales the exec worker to two and sends another: two shards run at once;
3. sends a third and kills the exec worker running one of its shards (SIGKILL to the
   container's main process, as the kernel's OOM killer would) while the shard runs: the
   container restarts, its orphaned shard container is removed, the shard runs again, and the
   run has the same results as run 2 (the same tests), each once;
4. brings the stack down (volumes removed).

The sample upstream gets three commits of its own here, each editing a test file of eight
tests that take 2 s each, so a shard runs long enough to be killed in the middle.

Prints each step's seconds. Needs Podman with its API socket (`bash scripts/services.sh`
starts it) and podman-compose (installed by `bash scripts/setup.sh`, a dev dependency).

    python bench/bench_compose.py [--workdir /var/tmp/ci-relay-compose] [--port 18000] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci_relay.demo import SAMPLE_REPOSITORY, pull_request_payload, send_webhook  # noqa: E402
from ci_relay.execution.runtimes import PODMAN_SOCKET  # noqa: E402
from ci_relay.execution.runtimes.container import OWNER_LABEL  # noqa: E402
from ci_relay.sample_upstream import (  # noqa: E402
    SampleCommit,
    SampleUpstream,
    build_sample_upstream,
)
from ci_relay.source_digest import TAG_PREFIX, source_digest  # noqa: E402

PROJECT = "ci-relay-bench"  # not "ci-relay": a real stack on this machine is left alone
RELAY_UID = 1000  # the relay image's user (docker/relay.Containerfile)
EXEC_SERVICE = "exec-spyre"
SLOW_TESTS = (
    """
import time

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase, run_tests


class TestBenchSlow(TestCase):
"""
    + "".join(
        f"""
    def test_step_{i}(self, device):
        time.sleep(2)
        x = torch.full((4,), {i}.0, device=device)
        self.assertEqual((x + 1).cpu().tolist(), [{i + 1}.0] * 4)
"""
        for i in range(8)
    )
    + """

instantiate_device_type_tests(TestBenchSlow, globals())

if __name__ == "__main__":
    run_tests()
"""
)
SPEC = """test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_bench_slow.py
      unlisted_test_mode: mandatory_success
"""


def _with_slow_commits(sample: SampleUpstream) -> SampleUpstream:
    """Three commits on top of the sample upstream, each a new head editing the slow tests."""
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    commits = list(sample.commits)
    for n in range(3):
        target = sample.path / "test" / "test_bench_slow.py"
        target.write_text(f"# edit {n}{SLOW_TESTS}")
        subprocess.run([*git, "add", "test/test_bench_slow.py"], cwd=sample.path, check=True)
        subprocess.run(
            [*git, "commit", "-qm", f"slow tests, edit {n}"], cwd=sample.path, check=True
        )
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=sample.path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        commits.append(SampleCommit(head, f"slow tests, edit {n}"))
    return SampleUpstream(sample.path, commits)


def _override(data: Path, upstream: Path) -> str:
    """The bench's own settings on top of the two compose files: the sample upstream, its
    policy, the emulated card, two shards a run, and an exec worker for them."""
    common = {
        "CI_RELAY_UPSTREAM_REPO": str(upstream),
        "CI_RELAY_POLICY_FILE": str(data / "policy.yaml"),
        "CI_RELAY_SPECS": json.dumps([str(data / "spec.yaml")]),
        "CI_RELAY_SELECTION_AGENT": "none",
        "CI_RELAY_SHARDS_PER_RUN": "2",
        "CI_RELAY_SELECTION_BUDGET": "all",  # every slow test: shards long enough to kill
        "CI_RELAY_RECONCILE_AFTER_SECONDS": "10",
        # the broker's visibility timeout stays at its default (4 h): a killed worker's shard
        # comes back when its heartbeat has been silent this long (the reconciler, every 15 s)
        "CI_RELAY_CLAIM_STALE_SECONDS": "20",
    }
    services = {
        "api": {"environment": common},
        "worker": {"environment": common},
        EXEC_SERVICE: {
            "command": [
                "ci-relay",
                "worker",
                "--queues",
                "exec.spyre-emu,triage",
                "--concurrency",
                "1",
            ],
            "environment": {**common, "CI_RELAY_DEVICES": "2"},
        },
    }
    return json.dumps({"services": services}, indent=2)  # JSON is YAML


class Stack:
    def __init__(self, workdir: Path, port: int, tag: str) -> None:
        self.workdir, self.port = workdir, port
        self.data = workdir / "data"
        self.secret = secrets.token_hex(16)
        self.override = workdir / "compose.bench.yaml"
        self.env = {
            **os.environ,
            "CI_RELAY_IMAGE_TAG": tag,
            "CI_RELAY_WEBHOOK_SECRET": self.secret,
            "CI_RELAY_HOST_DATA": str(self.data),
            "CI_RELAY_API_PORT": str(port),
            "CI_RELAY_ENGINE_SOCKET": PODMAN_SOCKET.removeprefix("unix://"),
            "CONTAINERS_CONF": str(ROOT / "docker" / "containers.conf"),
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [ROOT / "docker" / "compose.yaml", ROOT / "docker" / "compose.local.yaml"]
        argv = ["podman-compose", "-p", PROJECT]
        for file in [*files, self.override]:
            argv += ["-f", str(file)]
        proc = subprocess.run(
            [*argv, *args], env=self.env, capture_output=True, text=True, check=False
        )
        if check and proc.returncode:
            raise SystemExit(f"podman-compose {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
        return proc

    def down(self) -> None:
        """`down -v`, then whatever it left: podman-compose removes only the replicas the
        files name (not the scaled-up ones), and then neither the pod, the network nor the
        volumes those still hold."""
        if self.override.exists():
            self.compose("down", "-v", check=False)
        label = f"label=io.podman.compose.project={PROJECT}"
        for kind, extra in (("container", ["-a"]), ("pod", []), ("volume", []), ("network", [])):
            if kind == "pod":  # the pod carries no labels: podman-compose names it
                listed = [f"pod_{PROJECT}"]
            else:
                listed = subprocess.run(
                    ["podman", kind, "ls", *extra, "-q", "--filter", label],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout.split()
            if listed:
                subprocess.run(["podman", kind, "rm", "-f", *listed], capture_output=True)

    def prepare(self) -> SampleUpstream:
        self.down()
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.data.mkdir(parents=True)
        sample = _with_slow_commits(build_sample_upstream(self.data / "upstream-src"))
        (self.data / "spec.yaml").write_text(SPEC)
        (self.data / "policy.yaml").write_text(
            f"repositories:\n  {SAMPLE_REPOSITORY}:\n    backends:\n"
            "      spyre-emu: {level: L3, device: spyre}\n"
        )
        (self.data / "tmp").mkdir()
        for path in [self.data, *self.data.rglob("*")]:  # the API and worker run as `relay`
            os.lchown(path, RELAY_UID, RELAY_UID)
        self.override.write_text(_override(self.data, sample.path))
        return sample

    def wait_ready(self, timeout: float) -> None:
        _until(lambda: _get(f"{self.url}/readyz") is not None, timeout, "the API's /readyz")

    def send(self, sample: SampleUpstream, head_index: int, number: int) -> str:
        response = send_webhook(
            self.url, self.secret, "pull_request", pull_request_payload(sample, head_index, number)
        )
        response.raise_for_status()
        return str(response.json()["delivery_id"])

    def change(self, delivery_id: str) -> dict[str, Any] | None:
        for change in _get(f"{self.url}/api/changes") or []:
            if change["delivery_id"] == delivery_id:
                return dict(change)
        return None

    def exec_containers(self) -> list[str]:
        proc = subprocess.run(
            [
                "podman",
                "ps",
                "--format",
                "{{.Names}}",
                "--filter",
                f"name={PROJECT}_{EXEC_SERVICE}",
            ],
            capture_output=True,
            text=True,
            check=True,
            env=self.env,
        )
        return sorted(proc.stdout.split())

    def logs(self) -> str:
        return self.compose("logs", "--tail", "40", check=False).stdout


def shard_containers() -> list[dict[str, str]]:
    """The runner containers the exec workers have started, with the owner label."""
    proc = subprocess.run(
        ["podman", "ps", "--filter", f"label={OWNER_LABEL}", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(proc.stdout or "[]")
    return [{"id": r["Id"], "owner": r["Labels"][OWNER_LABEL]} for r in rows]


def _restarts(container: str) -> int:
    proc = subprocess.run(
        ["podman", "inspect", "--format", "{{.RestartCount}}", container],
        capture_output=True,
        text=True,
        check=False,
    )
    return int(proc.stdout.strip() or 0)


def _get(url: str) -> Any:
    try:
        response = httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def _until(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"no {what} after {timeout:.0f}s")


def results_of(stack: Stack, change: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Every result's (backend, nodeid) of a change, and its shards' states and attempts."""
    ids, shards = [], []
    for run in change["runs"]:
        detail = _get(f"{stack.url}/api/runs/{run['id']}")
        for shard in detail["shards"]:
            ids += [f"{run['backend']} {r['nodeid']}" for r in shard["results"]]
            shards.append({k: shard[k] for k in ("index", "state", "attempts", "error")})
    return ids, shards


def _one_run(
    stack: Stack, sample: SampleUpstream, head_index: int, number: int, timeout: float
) -> dict[str, Any]:
    """One webhook and its change once completed (run 1: nothing watched on the way)."""
    delivery = stack.send(sample, head_index, number)
    return dict(
        _until(
            lambda: (c := stack.change(delivery)) and c["state"] == "completed" and c,
            timeout,
            "completed change",
        )
    )


def _watched_run(
    stack: Stack, sample: SampleUpstream, timeout: float, peak: list[int]
) -> dict[str, Any]:
    """Run 2, with the most shard containers seen up at once kept in ``peak[0]``: two exec
    workers should run two shards side by side."""
    delivery = stack.send(sample, -2, 102)  # the same tests as run 3

    def done() -> dict[str, Any] | None:
        peak[0] = max(peak[0], len(shard_containers()))
        change = stack.change(delivery)
        return change if change and change["state"] == "completed" else None

    return dict(_until(done, timeout, "completed change", every=0.2))


def _killed_run(stack: Stack, sample: SampleUpstream, timeout: float) -> tuple[dict[str, Any], str]:
    """Run 3, the exec worker running one of its shards killed mid-shard: the change once
    completed, and the killed worker's container (to count its restarts)."""
    delivery = stack.send(sample, -1, 103)
    running = _until(shard_containers, timeout, "running shard container", every=0.2)
    time.sleep(2)  # into the shard's tests
    host = running[0]["owner"].split(":")[0]
    victim = next(
        name
        for name in stack.exec_containers()
        if subprocess.run(
            ["podman", "inspect", "--format", "{{.Config.Hostname}}", name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        == host
    )
    pid = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Pid}}", victim],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"   SIGKILL to {victim} (pid {pid}; its shard container {running[0]['id'][:12]})")
    killed_at = time.monotonic()
    os.kill(int(pid), signal.SIGKILL)
    _until(lambda: _restarts(victim) >= 1, 120, "restart of the killed worker")
    print(f"   restarted after {time.monotonic() - killed_at:.1f} s")
    _until(
        lambda: running[0]["id"] not in {c["id"] for c in shard_containers()},
        120,
        "removal of the orphaned shard container",
    )
    print(f"   orphaned shard container removed after {time.monotonic() - killed_at:.1f} s")
    change = _until(
        lambda: (c := stack.change(delivery)) and c["state"] == "completed" and c,
        timeout,
        "completed change after the kill",
    )
    return dict(change), victim


def _print_timings(timings: list[tuple[str, float]]) -> None:
    """Each step's seconds, then the runs against each other: printed last, whatever failed."""
    print("== timings")
    for name, seconds in timings:
        print(f"   {name:<55} {seconds:7.1f} s")
    took = {name.split(":")[0]: seconds for name, seconds in timings}
    if {"run 1", "run 2", "run 3"} <= set(took):  # the baselines: run 1, one exec worker
        print(
            f"   two exec workers against one (run 2 / run 1): {took['run 2'] / took['run 1']:.2f}x"
        )
        print(
            f"   with a worker killed (run 3 / run 2): {took['run 3'] / took['run 2']:.2f}x "
            "(the shard waits until its heartbeat has been silent 20 s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/ci-relay-compose"))
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a step may take")
    parser.add_argument("--keep", action="store_true", help="leave the stack up at the end")
    args = parser.parse_args()
    if shutil.which("podman-compose") is None:
        raise SystemExit("podman-compose is missing: bash scripts/setup.sh installs it")
    timings: list[tuple[str, float]] = []

    def step(name: str, action: Callable[[], Any]) -> Any:
        print(f"== {name}", flush=True)
        start = time.monotonic()
        value = action()
        timings.append((name, time.monotonic() - start))
        print(f"   {timings[-1][1]:.1f} s", flush=True)
        return value

    step(
        "images (relay, spyre-emu runner, redis, postgres)",
        lambda: subprocess.run(
            [
                sys.executable,
                "-m",
                "ci_relay",
                "images",
                "build",
                "--relay",
                "--services",
                "--backend",
                "spyre-emu",
            ],
            check=True,
        ),
    )
    stack = Stack(args.workdir, args.port, TAG_PREFIX + source_digest(ROOT))
    sample = step("prepare (sample upstream, policy, override)", stack.prepare)
    ok = False
    try:
        step("up (until /readyz)", lambda: (stack.compose("up", "-d"), stack.wait_ready(300)))

        first = step(
            "run 1: webhook -> completed (one exec worker)",
            lambda: _one_run(stack, sample, -3, 101, args.timeout),
        )
        print(f"   runs: {[(r['backend'], r['state'], r['counts']) for r in first['runs']]}")

        step(
            "scale the exec worker to two",
            lambda: stack.compose("up", "-d", "--scale", f"{EXEC_SERVICE}=2"),
        )
        print(f"   exec workers: {stack.exec_containers()}")
        peak = [0]
        second = step(
            "run 2: two exec workers", lambda: _watched_run(stack, sample, args.timeout, peak)
        )
        print(f"   shard containers at once, at most: {peak[0]}")

        killed, victim = step(
            "run 3: one exec worker killed mid-shard",
            lambda: _killed_run(stack, sample, args.timeout),
        )
        ids, shards = results_of(stack, killed)
        reference, _ = results_of(stack, second)
        print(f"   {victim} restarted {_restarts(victim)} time(s); shards {shards}")
        print(f"   results {len(ids)} ({len(set(ids))} distinct); run 2: {len(reference)}")
        if len(ids) != len(set(ids)) or sorted(ids) != sorted(reference):
            raise AssertionError("the killed run's results are not run 2's, each once")
        ok = True
    finally:
        if not ok:
            print(stack.logs(), file=sys.stderr)
        if args.keep:
            print(f"left up: {stack.url} (podman-compose -p {PROJECT} ... down -v to stop)")
        else:
            step("down (volumes removed)", stack.down)
    _print_timings(timings)


if __name__ == "__main__":
    main()
