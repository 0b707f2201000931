"""One process per device: an exclusive file lock (``filelock``, an ``flock``) per card.

A Spyre card is owned by one process at a time, so parallel pytest processes
on one card must fail loudly instead of interleaving. ``flock`` is released by
the kernel when the holder exits (even on SIGKILL), so a crashed test process
never leaves the device locked. The file records the holder's pid for the
error message; the lock itself, not the file's content, is what counts.

The lock file descriptor is close-on-exec: a subprocess started by the holder
does not keep the device after the holder exits. A ``fork()`` without exec
shares the lock with its parent (same open file), as a forked child shares the
parent's device context.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout

from spyre_emu.errors import DeviceBusyError

LOCK_DIR_ENV = "SPYRE_EMU_LOCK_DIR"

_held: dict[int, tuple[FileLock, Path]] = {}


def lock_dir() -> Path:
    """``$SPYRE_EMU_LOCK_DIR``, else a per-user folder in the system temp dir.

    Per user by default so that two users on one machine do not fight over
    folder permissions; point several users or containers at one shared folder
    to make them share one emulated card.
    """
    configured = os.environ.get(LOCK_DIR_ENV, "").strip()
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"spyre-emu-{os.getuid()}"


def lock_path(index: int) -> Path:
    return lock_dir() / f"spyre{index}.lock"


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "a process whose pid is not yet recorded"


def _record_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)


def acquire(index: int) -> Path:
    """Take device ``index`` for this process (no-op if already held); return the lock file."""
    held = _held.get(index)
    if held is not None:
        return held[1]
    path = lock_path(index)
    path.parent.mkdir(parents=True, exist_ok=True)
    # not thread-local: the card belongs to the process, whichever thread touched it first
    lock = FileLock(path, timeout=0, mode=0o666, thread_local=False, on_acquired=_record_pid)
    try:
        lock.acquire()
    except Timeout:
        raise DeviceBusyError(
            f"spyre:{index} is in use by {_holder(path)} (lock file {path}); the emulated Spyre "
            f"device, like the card, serves one process at a time. Set {LOCK_DIR_ENV} to a "
            "different folder to give this process its own emulated card."
        ) from None
    _held[index] = (lock, path)
    return path


def is_held(index: int) -> bool:
    return index in _held
