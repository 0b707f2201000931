"""``container``: a container through the Docker Engine API (Docker, or Podman's socket):
no network, no capabilities, an unprivileged user, a read-only image, limits checked
as applied before the container starts.

A container outlives the process that started it unless someone removes it, so each one is
labelled with its owner (host, pid, the pid's start time): the owner removes its live ones
when it exits, and a worker starting on the same host removes those whose owner is gone
(killed with SIGKILL, or the machine's previous boot). :func:`reap_orphaned_containers`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_relay.execution.runtimes.process import (
    BUILD_HINT,
    CONTAINER_NOFILE,
    CONTAINER_NPROC,
    CONTAINER_USER,
    ENGINE_LOG_MAX,
    MASK_DIR,
    PODMAN_SOCKET,
    SMALL_TMPFS_MB,
    TMPFS_MB,
    Completed,
    Invocation,
    Limits,
    RuntimeUnavailable,
    WorkerStopping,
    _is_root,
    _namespace_pids,
    _Output,
    _prepare_scratch,
    _ScratchWatch,
    shard_env,
)
from ci_relay.execution.runtimes.sandbox import _visible_as
from ci_relay.source_digest import TAG_PREFIX, own_image_tag

OWNER_LABEL = "ci-relay.shard-owner"
"""Label on every shard container: ``HOST:PID:START`` of the process that created it."""


def _process_start(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22): with
    the pid it names one process, even once the pid is reused. None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name before ")" may hold spaces
    return fields[19] if len(fields) > 19 else None


def process_owner() -> str:
    """This process as a container owner label value."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_process_start(pid)}"


def owner_alive(owner: str) -> bool | None:
    """Whether the process an owner label names still runs; None when that cannot be told
    here (another host's container, or a label this code did not write)."""
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or not start:
        return None
    return _process_start(int(pid)) == start


class _LiveContainers:
    """This process's containers that exist right now; removed when the worker starts
    shutting down (:func:`stop_shard_containers`) and at interpreter exit, so none outlives
    a clean stop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._containers: dict[str, Any] = {}
        self._hooked = False
        self.stopping = threading.Event()

    def add(self, container: Any) -> None:
        with self._lock:
            if self.stopping.is_set():
                raise WorkerStopping("the worker is shutting down: no new shard process")
            self._containers[container.id] = container
            if not self._hooked:
                atexit.register(self.remove_all)
                self._hooked = True

    def discard(self, container: Any) -> None:
        with self._lock:
            self._containers.pop(container.id, None)

    def remove_all(self) -> int:
        with self._lock:
            containers = list(self._containers.values())
            self._containers.clear()
        for container in containers:
            with contextlib.suppress(Exception):  # exiting: the engine may be gone too
                container.remove(force=True)
        return len(containers)


_live = _LiveContainers()


def stop_shard_containers() -> int:
    """The worker is stopping: remove this process's shard containers now rather than
    wait hours for their shards, and start no new ones. Their shard tasks end with
    :class:`WorkerStopping`; the number removed is returned."""
    _live.stopping.set()
    return _live.remove_all()


@dataclass(frozen=True)
class ShardContainer:
    """One labelled shard container as the engine listed it."""

    id: str
    name: str
    state: str
    owner: str


def shard_containers(client: Any, owner: str | None = None) -> list[ShardContainer]:
    """The shard containers the engine holds (of ``owner`` only, if given), from one
    list call. ``client.containers.list`` inspects each listed container afterwards, and
    Podman answers 500 for one removed in between; the list call's own fields suffice."""
    label = OWNER_LABEL if owner is None else f"{OWNER_LABEL}={owner}"
    return [
        ShardContainer(
            id=row["Id"],
            name=(row.get("Names") or [""])[0].lstrip("/"),
            state=row.get("State", ""),
            owner=(row.get("Labels") or {}).get(OWNER_LABEL, ""),
        )
        for row in client.api.containers(all=True, filters={"label": label})
    ]


def reap_orphaned_containers(docker_host: str = PODMAN_SOCKET) -> list[str]:
    """Remove the shard containers of this host whose owning process is gone; their names.

    Containers of a live owner, or of another host sharing the engine, are left alone.
    """
    import docker.errors  # also binds ``docker``

    client = docker.DockerClient(base_url=docker_host, timeout=60)
    removed = []
    try:
        for container in shard_containers(client):
            if owner_alive(container.owner) is not False:
                continue
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(container.id, force=True)
                removed.append(container.name)
    finally:
        client.close()
    return removed


class ContainerRuntime:
    """A container per shard process through the Docker Engine API (Docker, or Podman's
    compatible socket at ``docker_host``): no capabilities, no new privileges, a non-root
    user, network off, read-only root, only scratch/work writable, memory/pids/cpu and
    file-size limits, bounded logs, an allowlisted environment, the worker's hidden files
    masked where a bound folder would show them."""

    name = "container"
    python = "python"

    def __init__(
        self,
        backend: str = "cpu",
        docker_host: str = PODMAN_SOCKET,
        hidden: Sequence[Path] = (),
        tag: str | None = None,
    ) -> None:
        # the image of this process's own sources, never :latest (see ci_relay.source_digest)
        self.backend = backend
        self.repository = f"localhost/ci-relay-runner-{backend}"
        self.image = f"{self.repository}:{tag or own_image_tag()}"
        self.docker_host = docker_host
        self.hidden = tuple(Path(p) for p in hidden)
        self._client: Any = None

    def _docker(self) -> Any:
        if self._client is None:
            import docker

            self._client = docker.DockerClient(base_url=self.docker_host, timeout=60)
        return self._client

    def check(self) -> None:
        import docker.errors

        try:
            self._docker().ping()
        except Exception as exc:
            raise RuntimeUnavailable(
                f"no container engine at {self.docker_host} "
                f"({type(exc).__name__}); start one (scripts/services.sh starts Podman's socket)"
            ) from None
        try:
            self._docker().images.get(self.image)
        except docker.errors.ImageNotFound:
            raise RuntimeUnavailable(self._missing_image()) from None
        with tempfile.TemporaryDirectory(prefix="ci-relay-probe-") as tmp:
            inv = Invocation(["true"], Path(tmp), Path(tmp), limits=Limits(scratch_mb=16))
            user, _owner = self._user()
            probe = self._create(inv, inv.argv, Path(tmp), user)  # created, never started
            try:
                self._verify(probe, inv, user)
            finally:
                with contextlib.suppress(docker.errors.APIError):
                    probe.remove(force=True)

    def _missing_image(self) -> str:
        """Why the image of these sources is missing, and the command that builds it."""
        hint = f"`{BUILD_HINT} --backend {self.backend}`"
        others = sorted(  # one list call: images.list inspects each image afterwards
            tag.rpartition(":")[2]
            for row in self._docker().api.images(name=self.repository)
            for tag in row.get("RepoTags") or ()
            if tag.rpartition(":")[2].startswith(TAG_PREFIX)
        )
        if others:
            return (
                f"runner image {self.image} is missing: {self.repository} exists only as "
                f"{', '.join(others)}, built from other ci-relay sources than this worker's; "
                f"its shards would run other code. Build it from these sources with {hint}"
            )
        return f"runner image {self.image} is missing: build it with {hint}"

    def _user(self) -> tuple[str, tuple[int, int] | None]:
        """The container's user, and who must own scratch/work (None: it is already ours)."""
        if _is_root():
            uid, gid = (int(x) for x in CONTAINER_USER.split(":"))
            return CONTAINER_USER, (uid, gid)
        return f"{os.getuid()}:{os.getgid()}", None

    def _masks(self, inv: Invocation) -> list[Any]:
        """Hidden paths the bound folders would show: /dev/null over a file, an empty
        read-only folder over a folder (a tmpfs would go under the bind, not over it)."""
        import docker.types

        mounts = []
        empty = inv.scratch / MASK_DIR
        for path in self.hidden:
            for shown in _visible_as(path, (inv.upstream, inv.scratch)):
                if shown.is_dir():
                    empty.mkdir(mode=0o555, exist_ok=True)
                    source = str(empty)
                elif shown.exists():
                    source = "/dev/null"
                else:
                    continue
                mounts.append(docker.types.Mount(str(shown), source, type="bind", read_only=True))
        return mounts

    def _create(self, inv: Invocation, argv: list[str], work: Path, user: str) -> Any:
        import docker.types

        quota = inv.limits.scratch_mb * 1024 * 1024
        env = {k: v for k, v in shard_env(inv.env, inv.scratch).items() if k != "PATH"}
        return self._docker().containers.create(
            self.image,
            command=argv,
            init=True,  # a real PID 1, so a test's signals (SIGSEGV, ...) act as on the host
            user=user,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            # both: Podman's compatible API ignores NetworkDisabled (the container got the
            # default bridge and the internet), and honours only the network mode
            network_disabled=True,
            network_mode="none",
            read_only=True,
            mem_limit=f"{inv.limits.memory_mb}m",
            memswap_limit=f"{inv.limits.memory_mb}m",
            pids_limit=inv.limits.pids,
            nano_cpus=int(inv.limits.cpus * 1e9) if inv.limits.cpus else None,
            ulimits=[
                docker.types.Ulimit(name="fsize", soft=quota, hard=quota),
                docker.types.Ulimit(name="core", soft=0, hard=0),
                docker.types.Ulimit(name="nofile", soft=CONTAINER_NOFILE, hard=CONTAINER_NOFILE),
                docker.types.Ulimit(name="nproc", soft=CONTAINER_NPROC, hard=CONTAINER_NPROC),
            ],
            # Docker's json-file driver; Podman maps it to k8s-file and honours max-size
            log_config=docker.types.LogConfig(
                type=docker.types.LogConfig.types.JSON, config={"max-size": ENGINE_LOG_MAX}
            ),
            tmpfs={
                "/tmp": f"size={TMPFS_MB}m,mode=1777",
                "/var/tmp": f"size={SMALL_TMPFS_MB}m,mode=1777",
            },
            environment=env,
            labels={OWNER_LABEL: process_owner()},
            working_dir=str(work),
            volumes={
                str(inv.upstream): {"bind": str(inv.upstream), "mode": "ro"},
                str(inv.scratch): {"bind": str(inv.scratch), "mode": "rw"},
            },
            mounts=self._masks(inv),
        )

    def _verify(self, container: Any, inv: Invocation, user: str) -> None:
        """Fail closed: an engine that dropped any of the isolation asked for (as Podman
        drops NetworkDisabled) runs nothing."""
        host = container.attrs.get("HostConfig", {})
        wrong = []
        if host.get("NetworkMode") != "none":
            wrong.append(f"network mode {host.get('NetworkMode')!r}")
        if not host.get("ReadonlyRootfs"):
            wrong.append("a writable root")
        if host.get("Privileged") or host.get("CapAdd"):
            wrong.append(f"privileges (added {host.get('CapAdd')})")
        if not host.get("CapDrop"):
            wrong.append("capabilities kept")
        if not any(o.startswith("no-new-privileges") for o in host.get("SecurityOpt") or []):
            wrong.append("new privileges allowed")
        if host.get("PidsLimit") != inv.limits.pids:
            wrong.append(f"pids limit {host.get('PidsLimit')}")
        if host.get("Memory") != inv.limits.memory_mb * 1024 * 1024:
            wrong.append(f"memory limit {host.get('Memory')}")
        if container.attrs.get("Config", {}).get("User") != user:
            wrong.append(f"user {container.attrs.get('Config', {}).get('User')!r}")
        if wrong:
            raise RuntimeUnavailable(
                f"the container engine at {self.docker_host} did not apply the isolation "
                f"asked for: {', '.join(wrong)}; no upstream code runs there"
            )

    def run(self, inv: Invocation) -> Completed:
        import docker.errors

        user, owner = self._user()
        work = _prepare_scratch(inv, owner, 0o700)
        container = self._create(inv, inv.argv, work, user)
        try:
            _live.add(container)
            self._verify(container, inv, user)
            container.start()
            watch = _ScratchWatch(inv.scratch, inv.limits.scratch_mb)
            code, timed_out, killed_for = _wait_polling(container, inv.limits.wall_seconds, watch)
            output = _Output()
            for chunk in container.logs(stream=True, follow=False):
                output.add(chunk)
        except docker.errors.APIError:
            if not _live.stopping.is_set():
                raise  # else: removed under it, so the engine no longer knows it
        finally:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
            _live.discard(container)
        if _live.stopping.is_set():  # removed under it: whatever it reported says nothing
            raise WorkerStopping("the worker is shutting down; the shard's container was removed")
        return Completed(code, output.text(), timed_out, killed_for)


def _wait_polling(
    container: Any, wall_seconds: float, watch: _ScratchWatch
) -> tuple[int, bool, str | None]:
    """Wait for the container to exit by asking for its state now and then.

    Not the engine's blocking ``wait``: Podman's API service busy-polls while one is open,
    burning a whole core per waiting shard (measured: two CPU-bound shards ran 0.66x as
    fast as one; polling brought them to parallel speed). Kills the container at the limit,
    or when its scratch folder goes over quota (counting deleted files its processes hold).
    """
    deadline = time.monotonic() + wall_seconds
    pause = 0.02
    while True:
        container.reload()
        state = container.attrs.get("State", {})
        if state.get("Status") in ("exited", "stopped", "dead"):
            return int(state.get("ExitCode", -1)), False, None
        if time.monotonic() >= deadline:
            container.kill()
            return -signal.SIGKILL, True, None
        pid = int(state.get("Pid") or 0)  # the container's PID 1, seen from the host
        killed_for = watch.over(functools.partial(_namespace_pids, pid) if pid > 0 else tuple)
        if killed_for:
            container.kill()
            return -signal.SIGKILL, False, killed_for
        time.sleep(pause)
        pause = min(pause * 2, 0.25)
