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
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import selectors
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# Variables a shard may see; everything else of the worker's environment (secrets!) stays out.
BASE_ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

PODMAN_SOCKET = "unix:///run/ci-relay/podman.sock"
BUILD_HINT = "ci-relay images build"
NOBODY = 65534  # the sandbox's default host user and group when the worker is root
CONTAINER_USER = "1000:1000"  # the runner images' `runner` user (docker/runner-*.Containerfile)
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


def work_dir(scratch: Path) -> Path:
    """The only folder of scratch the child may write: HOME, TMPDIR (``tmp``) and cwd."""
    return scratch / WORK


def shard_env(extra: dict[str, str], scratch: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in BASE_ENV_ALLOWLIST if k in os.environ}
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
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
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


class LocalRuntime:
    """A plain subprocess: no isolation at all. For development, clearly not for untrusted code."""

    name = "local"
    python = sys.executable

    def check(self) -> None:
        return None

    def run(self, inv: Invocation) -> Completed:
        work = _prepare_scratch(inv, None, 0o700)
        env = shard_env(inv.env, inv.scratch)
        prlimit = shutil.which("prlimit")
        argv = (_prlimit(prlimit, inv.limits) if prlimit else []) + inv.argv
        return _run(argv, env, work, inv.limits, inv.scratch)


def _under(path: Path, folders: Iterable[Path]) -> bool:
    return any(path == f or path.is_relative_to(f) for f in folders)


def _python_folders() -> list[Path]:
    """What the child's Python needs: its installation(s), site-packages, and the folders of
    the packages it imports (an editable install keeps them in the repository, whose root,
    with the worker's data, is not bound)."""
    prefixes = (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    found = [Path(p) for p in (*prefixes, *site.getsitepackages())]
    found.append(Path(os.path.realpath(sys.executable)).parent)
    for name in CHILD_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found += [Path(p) for p in spec.submodule_search_locations]
    # parents first: a folder inside one already bound needs no bind of its own
    return sorted({p for p in found if p.is_dir()}, key=lambda p: (len(p.parts), str(p)))


class _Mounts:
    """A bwrap command line's file system: what is bound where, the folders it creates."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self.bound: list[Path] = []  # host folders visible in the sandbox (as themselves)
        self.readonly: list[Path] = []  # bound read-only: their sub-folders exist already
        self.created: set[Path] = {Path("/")}

    def _parents(self, path: Path) -> None:
        for parent in reversed(path.parents):
            if parent in self.created or _under(parent, self.readonly):
                continue
            self.args += ["--perms", "0755", "--dir", str(parent)]  # bwrap's default is 0700
            self.created.add(parent)

    def bind(self, path: Path, writable: bool = False) -> None:
        if path == Path("/"):
            raise RuntimeUnavailable("refusing to bind the whole file system into the sandbox")
        if not writable and _under(path, self.readonly):
            return
        self._parents(path)
        self.args += ["--bind" if writable else "--ro-bind", str(path), str(path)]
        self.bound.append(path)
        if not writable:
            self.readonly.append(path)

    def tmpfs(self, path: Path, size_mb: int, mode: str) -> None:
        self._parents(path)
        self.args += ["--perms", mode, "--size", str(size_mb * 1024 * 1024), "--tmpfs", str(path)]
        self.created.add(path)

    def symlink(self, target: str, path: Path) -> None:
        self.args += ["--symlink", target, str(path)]
        self.created.add(path)

    def hide(self, hidden: Iterable[Path]) -> None:
        """Mask each hidden path that a bound folder would show: an empty file or folder."""
        for path in hidden:
            for shown in _visible_as(path, self.bound):
                if shown.is_dir():
                    self.args += ["--perms", "0700", "--size", "4096", "--tmpfs", str(shown)]
                    self.args += ["--remount-ro", str(shown)]
                elif shown.exists():
                    self.args += ["--ro-bind", "/dev/null", str(shown)]


def _visible_as(path: Path, bound: Iterable[Path]) -> list[Path]:
    """Where a host path shows inside a sandbox or container with these folders bound,
    by the folder's own name or its real one."""
    real = Path(os.path.realpath(path))
    shown = []
    for folder in bound:
        for base in {folder, Path(os.path.realpath(folder))}:
            for candidate in (path, real):
                if candidate == base or candidate.is_relative_to(base):
                    shown.append(folder / candidate.relative_to(base))
    return sorted(set(shown))


class SandboxRuntime:
    """bubblewrap. Only /usr, /etc, the Python installation and the child's packages are
    bound (read-only), plus the upstream tree (read-only) and scratch; /tmp, /run, /var/tmp
    and /dev/shm are small tmpfs; new network, PID, IPC, UTS and cgroup namespaces; the
    environment cleared to an allowlist; the worker's hidden files masked; address-space,
    process, file-size limits. A root worker's tests run as an unprivileged host user
    (``uid``:``gid``) with no capabilities at all; another worker's as itself in a user
    namespace that cannot make more of them."""

    name = "sandbox"
    python = sys.executable

    def __init__(self, uid: int = NOBODY, gid: int = NOBODY, hidden: Sequence[Path] = ()) -> None:
        if _is_root() and (uid == 0 or gid == 0):
            raise RuntimeUnavailable("the sandbox's user must not be root (sandbox uid/gid 0)")
        self.uid, self.gid = uid, gid
        self.hidden = tuple(Path(p) for p in hidden)

    def _tools(self) -> tuple[str, str, str | None]:
        bwrap, prlimit = shutil.which("bwrap"), shutil.which("prlimit")
        setpriv = shutil.which("setpriv") if _is_root() else None
        if bwrap is None:
            raise RuntimeUnavailable("bubblewrap is not installed (apt-get install bubblewrap)")
        if prlimit is None:
            raise RuntimeUnavailable("prlimit is missing (util-linux): no limits, no sandbox")
        if _is_root() and setpriv is None:
            raise RuntimeUnavailable(
                "setpriv is missing (util-linux): a root worker cannot drop to the sandbox user"
            )
        return bwrap, prlimit, setpriv

    def check(self) -> None:
        self._tools()
        with tempfile.TemporaryDirectory(prefix="ci-relay-probe-") as tmp:
            root = Path(tmp)
            (root / "up").mkdir()
            (root / "up").chmod(0o755)
            probe = (
                "import os, ci_relay; "
                "status = open('/proc/self/status').read(); "
                "assert 'CapEff:\\t0000000000000000' in status, status; "
                "assert 'NoNewPrivs:\\t1' in status, status; "
                "assert os.getuid() != 0"
            )
            done = self.run(
                Invocation(
                    [self.python, "-c", probe],
                    root / "up",
                    root / "scratch",
                    limits=Limits(wall_seconds=120, scratch_mb=16),
                )
            )
        if done.returncode != 0:
            raise RuntimeUnavailable(
                f"bubblewrap cannot create a sandbox here (exit {done.returncode}): "
                f"{done.output.strip()[-2000:]}"
            )

    def command(self, inv: Invocation, env: dict[str, str]) -> list[str]:
        """The bwrap command line for ``inv`` (public for tests and for reading)."""
        bwrap, prlimit, setpriv = self._tools()
        root = _is_root()
        args = [bwrap, "--die-with-parent", "--new-session", "--unshare-net", "--unshare-pid"]
        args += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if root:  # no user namespace: drop to the sandbox user with setpriv, inside
            args += ["--cap-drop", "ALL"]
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            args += ["--cap-add", "CAP_SETPCAP"]
        else:
            args += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
        mounts = _Mounts()
        for top in ("usr", "etc"):
            mounts.bind(Path("/") / top)
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / name
            if host.is_symlink():
                mounts.symlink(os.readlink(host), host)
            elif host.is_dir():
                mounts.bind(host)
        mounts.args += ["--dev", "/dev", "--proc", "/proc"]
        mounts.created |= {Path("/dev"), Path("/proc")}
        mounts.tmpfs(Path("/dev/shm"), TMPFS_MB, "1777")
        mounts.tmpfs(Path("/tmp"), TMPFS_MB, "1777")
        mounts.tmpfs(Path("/var/tmp"), SMALL_TMPFS_MB, "1777")
        mounts.tmpfs(Path("/run"), SMALL_TMPFS_MB, "0755")
        for folder in _python_folders():
            mounts.bind(folder)
        mounts.bind(inv.upstream)
        mounts.bind(inv.scratch, writable=True)
        mounts.hide(self.hidden)
        args += mounts.args
        args += ["--chdir", str(work_dir(inv.scratch)), "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
        args.append("--")
        if setpriv is not None:
            args += [setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
            args += ["--inh-caps=-all", "--bounding-set=-all"]
        return args + _prlimit(prlimit, inv.limits) + inv.argv

    def run(self, inv: Invocation) -> Completed:
        root = _is_root()
        # bwrap's --chdir runs as root without CAP_DAC_OVERRIDE: work must be 0711, not 0700
        _prepare_scratch(inv, (self.uid, self.gid) if root else None, 0o711 if root else 0o700)
        env = shard_env(inv.env, inv.scratch)
        argv = self.command(inv, env)
        return _run(argv, {}, Path("/"), inv.limits, inv.scratch, namespaced=True)


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
    ) -> None:
        self.image = f"localhost/ci-relay-runner-{backend}:latest"
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
            raise RuntimeUnavailable(
                f"runner image {self.image} is missing: build it with `{BUILD_HINT}`"
            ) from None
        with tempfile.TemporaryDirectory(prefix="ci-relay-probe-") as tmp:
            inv = Invocation(["true"], Path(tmp), Path(tmp), limits=Limits(scratch_mb=16))
            user, _owner = self._user()
            probe = self._create(inv, inv.argv, Path(tmp), user)  # created, never started
            try:
                self._verify(probe, inv, user)
            finally:
                with contextlib.suppress(docker.errors.APIError):
                    probe.remove(force=True)

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
            self._verify(container, inv, user)
            container.start()
            watch = _ScratchWatch(inv.scratch, inv.limits.scratch_mb)
            code, timed_out, killed_for = _wait_polling(container, inv.limits.wall_seconds, watch)
            output = _Output()
            for chunk in container.logs(stream=True, follow=False):
                output.add(chunk)
            return Completed(code, output.text(), timed_out, killed_for)
        finally:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)


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
