"""Where a shard's process runs: ``local`` (development only), ``sandbox`` (bubblewrap).

Every runtime gets the same request — a command, a read-only upstream tree, a
writable scratch folder, limits and an explicit environment — and returns the
exit status and output. A wall-clock timeout kills the whole process tree.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Variables a shard may see; everything else of the worker's environment (secrets!) stays out.
BASE_ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 4096
    pids: int = 512
    wall_seconds: float = 3600.0


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


RUNTIMES: dict[str, type[LocalRuntime] | type[SandboxRuntime]] = {
    "local": LocalRuntime,
    "sandbox": SandboxRuntime,
}


def get_runtime(name: str) -> Runtime:
    try:
        runtime: Runtime = RUNTIMES[name]()
    except KeyError:
        raise RuntimeUnavailable(
            f"unknown runtime {name!r} (known: {', '.join(RUNTIMES)})"
        ) from None
    runtime.check()
    return runtime


def python() -> str:
    return sys.executable
