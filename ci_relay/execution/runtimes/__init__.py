"""Where a shard's process runs: ``local`` (development only), ``sandbox`` (bubblewrap),
``container`` (a container through the Docker Engine API: Docker or Podman's socket).

Every runtime gets the same request — a command, a read-only upstream tree, a
scratch folder, limits and an explicit environment — and returns the exit status
and a bounded excerpt of the output. Upstream test code is hostile, so the two
isolating runtimes fail closed: an unprivileged user without capabilities, no
network, nothing of the worker's files but what the child needs (read-only), the
worker's own secrets masked, and limits on memory, processes and disk. The child
writes only ``scratch/work`` (its HOME, TMPDIR and working folder) and the files
the caller names as ``outputs``; the rest of the scratch folder stays the
worker's. A watchdog kills the process when the scratch folder grows past its
quota, and a wall-clock timeout kills the whole process tree.

One module per runtime (``local``, ``sandbox``, ``container``) and what they share
(``process``); :func:`get_runtime` picks one by name and checks it can run here.
"""

from __future__ import annotations

from ci_relay.execution.runtimes.container import ContainerRuntime
from ci_relay.execution.runtimes.local import LocalRuntime
from ci_relay.execution.runtimes.process import (
    BASE_ENV_ALLOWLIST,
    BUILD_HINT,
    CHILD_PACKAGES,
    CONTAINER_NOFILE,
    CONTAINER_NPROC,
    CONTAINER_USER,
    DRAIN_SECONDS,
    ENGINE_LOG_MAX,
    MASK_DIR,
    MAX_OUTPUT_BYTES,
    MAX_SCRATCH_ENTRIES,
    NOBODY,
    OUTPUT_HEAD_BYTES,
    PODMAN_SOCKET,
    SCRATCH_POLL_SECONDS,
    SMALL_TMPFS_MB,
    TMPFS_MB,
    WORK,
    Completed,
    Invocation,
    Limits,
    Runtime,
    RuntimeOptions,
    RuntimeUnavailable,
    WorkerStopping,
    scratch_usage,
    shard_env,
    work_dir,
)
from ci_relay.execution.runtimes.sandbox import SandboxRuntime

RUNTIMES = ("local", "sandbox", "container")


def get_runtime(name: str, backend: str = "cpu", options: RuntimeOptions | None = None) -> Runtime:
    options = options or RuntimeOptions()
    runtime: Runtime
    if name == "local":
        runtime = LocalRuntime()
    elif name == "sandbox":
        runtime = SandboxRuntime(options.sandbox_uid, options.sandbox_gid, options.hidden)
    elif name == "container":
        runtime = ContainerRuntime(backend, options.docker_host, options.hidden)
    else:
        raise RuntimeUnavailable(f"unknown runtime {name!r} (known: {', '.join(RUNTIMES)})")
    runtime.check()
    return runtime


__all__ = [
    "BASE_ENV_ALLOWLIST",
    "BUILD_HINT",
    "CHILD_PACKAGES",
    "CONTAINER_NOFILE",
    "CONTAINER_NPROC",
    "CONTAINER_USER",
    "DRAIN_SECONDS",
    "ENGINE_LOG_MAX",
    "MASK_DIR",
    "MAX_OUTPUT_BYTES",
    "MAX_SCRATCH_ENTRIES",
    "NOBODY",
    "OUTPUT_HEAD_BYTES",
    "PODMAN_SOCKET",
    "RUNTIMES",
    "SCRATCH_POLL_SECONDS",
    "SMALL_TMPFS_MB",
    "TMPFS_MB",
    "WORK",
    "Completed",
    "ContainerRuntime",
    "Invocation",
    "Limits",
    "LocalRuntime",
    "Runtime",
    "RuntimeOptions",
    "RuntimeUnavailable",
    "SandboxRuntime",
    "WorkerStopping",
    "get_runtime",
    "scratch_usage",
    "shard_env",
    "work_dir",
]
