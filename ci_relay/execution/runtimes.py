"""Where a shard's process runs: ``local`` (development only), ``sandbox`` (bubblewrap).

Every runtime gets the same request — a command, a read-only upstream tree, a
writable scratch folder, limits and an explicit environment — and returns the
exit status and output. A wall-clock timeout kills the whole process tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# Variables a shard may see; everything else of the worker's environment (secrets!) stays out.
BASE_ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 4096
    pids: int = 512
    wall_seconds: float = 3600.0
    cpus: float | None = None


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    upstream: Path
    scratch: Path
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Completed:
    returncode: int  # negative: killed by that signal
    output: str
    timed_out: bool


class RuntimeUnavailable(RuntimeError):
    pass


def shard_env(extra: dict[str, str], scratch: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in BASE_ENV_ALLOWLIST if k in os.environ}
    env.update(
        HOME=str(scratch),
        TMPDIR=str(scratch / "tmp"),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
        HF_HUB_OFFLINE="1",
    )
    env.update(extra)
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> Completed:
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return Completed(proc.returncode, out.decode(errors="replace"), False)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole tree, not just the direct child
        out, _ = proc.communicate()
        return Completed(-signal.SIGKILL, out.decode(errors="replace"), True)


class Runtime(Protocol):
    name: str
    python: str

    def check(self) -> None: ...

    def run(self, inv: Invocation) -> Completed: ...


def _prlimit(limits: Limits) -> list[str]:
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return []
    return [prlimit, f"--as={limits.memory_mb * 1024 * 1024}", f"--nproc={limits.pids}", "--"]


class LocalRuntime:
    """A plain subprocess: no isolation at all. For development, clearly not for untrusted code."""

    name = "local"
    python = sys.executable

    def check(self) -> None:
        return None

    def run(self, inv: Invocation) -> Completed:
        (inv.scratch / "tmp").mkdir(parents=True, exist_ok=True)
        env = shard_env(inv.env, inv.scratch)
        return _run(_prlimit(inv.limits) + inv.argv, env, inv.scratch, inv.limits.wall_seconds)


class SandboxRuntime:
    """bubblewrap: no network, read-only root, only the scratch folder writable, a new PID
    namespace, the environment cleared to an allowlist, and address-space/process limits."""

    name = "sandbox"
    python = sys.executable

    def check(self) -> None:
        if shutil.which("bwrap") is None:
            raise RuntimeUnavailable("bubblewrap is not installed (apt-get install bubblewrap)")
        probe = subprocess.run(
            ["bwrap", "--ro-bind", "/", "/", "--unshare-net", "--dev", "/dev", "true"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode != 0:
            raise RuntimeUnavailable(
                f"bubblewrap cannot create a sandbox here: {probe.stderr.strip()}"
            )

    def run(self, inv: Invocation) -> Completed:
        (inv.scratch / "tmp").mkdir(parents=True, exist_ok=True)
        env = shard_env(inv.env, inv.scratch)
        wrapper = [
            "bwrap",
            "--die-with-parent",
            "--new-session",
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/run",
            "--tmpfs",
            "/var/tmp",
            "--ro-bind",
            str(inv.upstream),
            str(inv.upstream),
            "--bind",
            str(inv.scratch),
            str(inv.scratch),
            "--chdir",
            str(inv.scratch),
            "--clearenv",
        ]
        for key, value in env.items():
            wrapper += ["--setenv", key, value]
        return _run(
            wrapper + _prlimit(inv.limits) + inv.argv, {}, inv.scratch, inv.limits.wall_seconds
        )


PODMAN_SOCKET = "unix:///run/ci-relay/podman.sock"
BUILD_HINT = "ci-relay images build"


class ContainerRuntime:
    """A container per shard process through the Docker Engine API (Docker, or Podman's
    compatible socket, chosen by DOCKER_HOST): network off, read-only root, only the scratch
    folder writable, memory/pids/cpu limits, an allowlisted environment, a non-root user."""

    name = "container"
    python = "python"

    def __init__(self, backend: str = "cpu") -> None:
        self.image = f"localhost/ci-relay-runner-{backend}:latest"
        self._client: Any = None

    def _docker(self) -> Any:
        if self._client is None:
            import docker

            base_url = os.environ.get("DOCKER_HOST", PODMAN_SOCKET)
            self._client = docker.DockerClient(base_url=base_url, timeout=60)
        return self._client

    def check(self) -> None:
        import docker.errors

        try:
            self._docker().ping()
        except Exception as exc:
            raise RuntimeUnavailable(
                f"no container engine at {os.environ.get('DOCKER_HOST', PODMAN_SOCKET)} "
                f"({type(exc).__name__}); start one (scripts/services.sh starts Podman's socket)"
            ) from None
        try:
            self._docker().images.get(self.image)
        except docker.errors.ImageNotFound:
            raise RuntimeUnavailable(
                f"runner image {self.image} is missing: build it with `{BUILD_HINT}`"
            ) from None

    def run(self, inv: Invocation) -> Completed:
        import docker.errors

        (inv.scratch / "tmp").mkdir(parents=True, exist_ok=True)
        for path in (inv.scratch, inv.scratch / "tmp"):
            path.chmod(0o777)  # the container's unprivileged user writes only here
        env = {k: v for k, v in shard_env(inv.env, inv.scratch).items() if k != "PATH"}
        container = self._docker().containers.run(
            self.image,
            command=inv.argv,
            detach=True,
            init=True,  # a real PID 1, so a test's signals (SIGSEGV, ...) act as on the host
            network_disabled=True,
            read_only=True,
            mem_limit=f"{inv.limits.memory_mb}m",
            memswap_limit=f"{inv.limits.memory_mb}m",
            pids_limit=inv.limits.pids,
            nano_cpus=int(inv.limits.cpus * 1e9) if inv.limits.cpus else None,
            environment=env,
            working_dir=str(inv.scratch),
            volumes={
                str(inv.upstream): {"bind": str(inv.upstream), "mode": "ro"},
                str(inv.scratch): {"bind": str(inv.scratch), "mode": "rw"},
            },
        )
        try:
            code, timed_out = _wait_polling(container, inv.limits.wall_seconds)
            output = container.logs().decode(errors="replace")
            return Completed(code, output, timed_out)
        finally:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)


def _wait_polling(container: Any, wall_seconds: float) -> tuple[int, bool]:
    """Wait for the container to exit by asking for its state now and then.

    Not the engine's blocking ``wait``: Podman's API service busy-polls while one is open,
    burning a whole core per waiting shard (measured: two CPU-bound shards ran 0.66x as
    fast as one; polling brought them to parallel speed). Kills the container at the limit.
    """
    deadline = time.monotonic() + wall_seconds
    pause = 0.02
    while True:
        container.reload()
        state = container.attrs.get("State", {})
        if state.get("Status") in ("exited", "stopped", "dead"):
            return int(state.get("ExitCode", -1)), False
        if time.monotonic() >= deadline:
            container.kill()
            return -signal.SIGKILL, True
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


RUNTIMES = ("local", "sandbox", "container")


def get_runtime(name: str, backend: str = "cpu") -> Runtime:
    runtime: Runtime
    if name == "local":
        runtime = LocalRuntime()
    elif name == "sandbox":
        runtime = SandboxRuntime()
    elif name == "container":
        runtime = ContainerRuntime(backend)
    else:
        raise RuntimeUnavailable(f"unknown runtime {name!r} (known: {', '.join(RUNTIMES)})")
    runtime.check()
    return runtime
