"""``sandbox``: bubblewrap. Only what the child needs is bound (read-only), the worker's
secrets are masked, no network, an unprivileged user, and process limits."""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from ci_relay.execution.runtimes.process import (
    CHILD_PACKAGES,
    NOBODY,
    SMALL_TMPFS_MB,
    TMPFS_MB,
    Completed,
    Invocation,
    Limits,
    RuntimeUnavailable,
    _is_root,
    _prepare_scratch,
    _prlimit,
    _run,
    shard_env,
    work_dir,
)


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
