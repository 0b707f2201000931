"""What every runtime shares: the request and its limits, the environment a shard may see,
the scratch folder and its quota watchdog, bounded output, and running a process tree under
a wall-clock limit."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ci_relay.runtime_defaults import NOBODY as NOBODY  # re-exported for the runtimes
from ci_relay.runtime_defaults import PODMAN_SOCKET as PODMAN_SOCKET

# Variables a shard may see; everything else of the worker's environment (secrets!) stays out.
BASE_ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# OpenMP's idle workers sleep instead of spinning, unless the worker's environment or the
# request says otherwise. With one core busy elsewhere, a sandboxed shard's spinning torch
# worker used almost as much CPU as its tests (issue 37: part of test_unary_ufuncs.py took
# 2.4x its in-process time, 0.95x with PASSIVE); the shard runs in a session of its own,
# likely a scheduling group of its own too, where the spinner's time is the tests' time.
OMP_WAIT_POLICY = "PASSIVE"

BUILD_HINT = "ci-relay images build"
CONTAINER_USER = "1000:1000"  # the runner images' `runner` user (docker/runner.Containerfile)
CHILD_PACKAGES = ("ci_relay", "reuse_specs", "spyre_emu", "test_selection")

MAX_OUTPUT_BYTES = 1024 * 1024  # of a process's output kept in memory: head and tail
OUTPUT_HEAD_BYTES = 256 * 1024
ENGINE_LOG_MAX = "8m"  # what the container engine keeps on disk (Podman honours it too)
SCRATCH_POLL_SECONDS = 0.5  # how often the watchdog measures the scratch folder
MAX_SCRATCH_ENTRIES = 200_000  # files and folders: inodes are a disk resource too
TMPFS_MB = 64  # the sandbox's /tmp and /dev/shm, the container's /tmp (memory, not disk)
SMALL_TMPFS_MB = 8  # /var/tmp and /run
CONTAINER_NOFILE = 1024  # explicit: Podman's own defaults exceed what runc may set here
CONTAINER_NPROC = 4096  # per-user ceiling; the real process limit is the pids cgroup
DRAIN_SECONDS = 10.0  # reading what is left in the pipe once the process is gone
WORK = "work"  # the child's HOME, TMPDIR parent and working folder, inside scratch
MASK_DIR = ".masked"  # an empty folder in scratch, bound over hidden folders in a container


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 4096
    pids: int = 512
    wall_seconds: float = 3600.0
    cpus: float | None = None
    scratch_mb: int = 2048  # disk the child may use in scratch; also the largest file it writes


@dataclass(frozen=True)
class RuntimeOptions:
    """How a worker's runtimes are set up (from its settings)."""

    docker_host: str = PODMAN_SOCKET  # the container engine's API
    sandbox_uid: int = NOBODY  # the host user a sandboxed test runs as when the worker is root
    sandbox_gid: int = NOBODY
    hidden: tuple[Path, ...] = ()  # the worker's own files (settings, keys): never readable


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    upstream: Path
    scratch: Path
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    # files directly in ``scratch`` the child writes (its progress log): the runtime creates
    # them, owned by the child's user; everything else outside scratch/work is read-only
    outputs: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Completed:
    returncode: int  # negative: killed by that signal
    output: str  # head and tail, at most MAX_OUTPUT_BYTES (plus the cut mark)
    timed_out: bool
    # why the runtime killed the process, completing "the test ... and was killed"
    # (e.g. "wrote more than 64 MB to its scratch folder"); None when it ended on its own
    killed_for: str | None = None


class RuntimeUnavailable(RuntimeError):
    pass


class WorkerStopping(RuntimeError):
    """The worker is shutting down and stopped the shard's process on purpose: nothing may
    be concluded about its tests. The shard stays claimed; the reconciler runs it again."""


def work_dir(scratch: Path) -> Path:
    """The only folder of scratch the child may write: HOME, TMPDIR (``tmp``) and cwd."""
    return scratch / WORK


def shard_env(extra: dict[str, str], scratch: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in BASE_ENV_ALLOWLIST if k in os.environ}
    env["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", OMP_WAIT_POLICY)
    work = work_dir(scratch)
    env.update(
        HOME=str(work),
        TMPDIR=str(work / "tmp"),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
        HF_HUB_OFFLINE="1",
    )
    env.update(extra)
    return env


def _is_root() -> bool:
    return os.geteuid() == 0


def _prepare_scratch(inv: Invocation, owner: tuple[int, int] | None, work_mode: int) -> Path:
    """Scratch stays the worker's (0711: the child may only pass through it); ``work`` and
    ``work/tmp`` and the ``outputs`` are the child's. ``owner`` None: the child is the worker.
    Nothing the child may have left there (a symlink instead of a folder) is followed."""
    scratch = inv.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    scratch.chmod(0o711)
    work = work_dir(scratch)
    for folder, mode in ((work, work_mode), (work / "tmp", 0o700)):
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            folder.unlink()
        folder.mkdir(exist_ok=True)
        if owner is not None:
            os.chown(folder, *owner, follow_symlinks=False)
        folder.chmod(mode)
    for path in inv.outputs:
        if path.parent != scratch:
            raise ValueError(f"{path}: a runtime's outputs must be directly in {scratch}")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # never open what the child put there: a fresh file of our own
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            if owner is not None:
                os.fchown(fd, *owner)
        finally:
            os.close(fd)
    return work


class _Output:
    """A process's output as it streams in: the first OUTPUT_HEAD_BYTES and the last
    bytes up to MAX_OUTPUT_BYTES in all, whatever it prints."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self._tail_max = MAX_OUTPUT_BYTES - OUTPUT_HEAD_BYTES

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = OUTPUT_HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk[-self._tail_max :]
            if len(self.tail) > 2 * self._tail_max:  # trim now and then, not on every chunk
                del self.tail[: len(self.tail) - self._tail_max]

    def text(self) -> str:
        tail = self.tail[-self._tail_max :]
        cut = self.total - len(self.head) - len(tail)
        middle = f"\n…[{cut} bytes of output cut]…\n".encode() if cut else b""
        return bytes(self.head + middle + tail).decode(errors="replace")


def _namespace_pids(any_pid: int) -> list[int]:
    """Every process in the PID namespace of ``any_pid`` (seen from the host)."""
    try:
        ns = os.readlink(f"/proc/{any_pid}/ns/pid")
    except OSError:
        return []
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{name}/ns/pid") == ns:
                    pids.append(int(name))
    return pids


def scratch_usage(scratch: Path, pids: Iterable[int] = ()) -> tuple[int, int]:
    """Disk used in ``scratch`` (allocated blocks, bytes) and its number of entries, plus
    files the processes ``pids`` hold open after deleting them (invisible in the tree, the
    disk they hold is as real). Never follows a symlink the child planted."""
    try:
        device = os.lstat(scratch).st_dev
    except OSError:
        return 0, 0
    seen: set[tuple[int, int]] = set()
    used = entries = 0
    stack = [str(scratch)]
    while stack:
        top = stack.pop()
        try:
            listing = os.scandir(top)
        except PermissionError:  # a folder the child made unreadable (a worker that is not root)
            with contextlib.suppress(OSError):
                os.chmod(top, 0o700)
                stack.append(top)
            continue
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                used += info.st_blocks * 512
    for pid in pids:
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for name in names:
            try:
                if not os.readlink(f"{fds}/{name}").endswith(" (deleted)"):
                    continue
                info = os.stat(f"{fds}/{name}")
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if info.st_dev == device and stat.S_ISREG(info.st_mode) and key not in seen:
                seen.add(key)
                used += info.st_blocks * 512
    return used, entries


class _ScratchWatch:
    """Measures the scratch folder every SCRATCH_POLL_SECONDS (less often when a
    measurement is slow) and says why to kill once it is over its quota."""

    def __init__(self, scratch: Path, quota_mb: int) -> None:
        self.scratch = scratch
        self.quota_mb = quota_mb
        self.next = 0.0

    def over(self, pids: Callable[[], Iterable[int]] = tuple) -> str | None:
        """``pids``: the child's processes, asked for only when a measurement is due."""
        now = time.monotonic()
        if now < self.next:
            return None
        used, entries = scratch_usage(self.scratch, pids())
        spent = time.monotonic() - now
        self.next = time.monotonic() + max(SCRATCH_POLL_SECONDS, 4 * spent)
        if used > self.quota_mb * 1024 * 1024:
            return f"wrote more than {self.quota_mb} MB to its scratch folder"
        if entries > MAX_SCRATCH_ENTRIES:
            return f"created more than {MAX_SCRATCH_ENTRIES} files in its scratch folder"
        return None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _LiveGroups:
    """The process groups of this process's running shards (each shard starts a new
    session, so a worker's own exit would leave them running): killed when the worker
    stops, after which no new one starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: set[int] = set()
        self.stopping = threading.Event()

    def add(self, pgid: int) -> bool:
        """Remember a started group; False (and the group killed) if the worker is stopping."""
        with self._lock:
            if not self.stopping.is_set():
                self._groups.add(pgid)
                return True
        _kill_group(pgid)
        return False

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._groups.discard(pgid)

    def kill_all(self) -> int:
        with self._lock:
            self.stopping.set()
            groups = sorted(self._groups)
            self._groups.clear()
        for pgid in groups:
            _kill_group(pgid)
        return len(groups)


_live_groups = _LiveGroups()


def stop_shard_processes() -> int:
    """The worker is stopping (SIGTERM or Ctrl-C to it, or to the ``serve`` or ``demo`` that
    started it): kill the process trees of the running sandbox and local shards now rather
    than wait hours for them, and start no new ones. Their shard tasks end with
    :class:`WorkerStopping`; the number of trees killed is returned."""
    return _live_groups.kill_all()


def _first_child(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _run(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    limits: Limits,
    scratch: Path,
    namespaced: bool = False,
) -> Completed:
    """Run ``argv`` in a new session, reading its output as it comes (head and tail kept),
    until it ends, its wall-clock limit passes or its scratch folder goes over quota; the
    last two kill the whole tree. ``namespaced``: argv is bwrap, whose child's PID namespace
    holds every process of the sandbox (their deleted-but-open files count too)."""
    if _live_groups.stopping.is_set():
        raise WorkerStopping("the worker is shutting down: no new shard process")
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _live_groups.add(proc.pid)  # its session's group: the pid is the group id
    try:
        return _watch(proc, limits, scratch, namespaced)
    finally:
        _live_groups.discard(proc.pid)


def _watch(
    proc: subprocess.Popen[bytes], limits: Limits, scratch: Path, namespaced: bool
) -> Completed:
    """Read ``proc``'s output until it ends or a limit kills its tree (see :func:`_run`)."""
    assert proc.stdout is not None
    pipe = proc.stdout.fileno()
    os.set_blocking(pipe, False)
    output = _Output()
    watch = _ScratchWatch(scratch, limits.scratch_mb)
    deadline = time.monotonic() + limits.wall_seconds
    timed_out, killed_for = False, None
    drain_until: float | None = None
    pipe_open = True

    def sandbox_pids() -> list[int]:
        child = _first_child(proc.pid)  # the sandbox's PID 1, in its own namespace
        return _namespace_pids(child) if child else []

    with selectors.DefaultSelector() as selector:
        selector.register(pipe, selectors.EVENT_READ)
        while True:
            if pipe_open:
                for _key, _events in selector.select(timeout=0.1):
                    try:
                        chunk = os.read(pipe, 1 << 16)
                    except BlockingIOError:
                        continue
                    if chunk:
                        output.add(chunk)
                    else:  # closed: every process holding it is gone, or closed it
                        pipe_open = False
                        selector.unregister(pipe)
            else:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.1)
            exited = proc.poll() is not None
            if exited and not pipe_open:
                break
            now = time.monotonic()
            if drain_until is not None:
                if now > drain_until:
                    break  # something still holds the pipe after the kill: stop waiting
                continue
            if exited:
                _kill_group(proc.pid)  # leftovers of the tree still holding the pipe
                drain_until = now + DRAIN_SECONDS
                continue
            if now >= deadline:
                timed_out = True
            else:
                killed_for = watch.over(sandbox_pids if namespaced else tuple)
            if timed_out or killed_for:
                _kill_group(proc.pid)  # the whole tree, not just the direct child
                drain_until = now + DRAIN_SECONDS
    proc.stdout.close()
    code = proc.wait()
    if _live_groups.stopping.is_set():
        raise WorkerStopping("the worker is shutting down; the shard's processes were killed")
    if timed_out or killed_for:
        code = -signal.SIGKILL
    return Completed(code, output.text(), timed_out, killed_for)


class Runtime(Protocol):
    name: str
    python: str

    def check(self) -> None: ...

    def run(self, inv: Invocation) -> Completed: ...


def _prlimit(prlimit: str, limits: Limits) -> list[str]:
    return [
        prlimit,
        f"--as={limits.memory_mb * 1024 * 1024}",
        f"--nproc={limits.pids}",
        f"--fsize={limits.scratch_mb * 1024 * 1024}",
        "--core=0",  # a core dump is a file as large as the process, written into cwd
        "--",
    ]
