"""Device ownership: no more shard processes on a card than its backend allows.

A backend declares ``processes_per_device`` (Spyre: one process owns a card). Every worker on
a machine claims a slot by taking an exclusive file lock (``filelock``: an ``flock``) on one
of ``devices x processes_per_device`` files in a shared folder and holds it while the shard
runs. The kernel
drops the lock when the worker dies, so a killed worker never leaves a card claimed. Queue
concurrency alone cannot give this: two worker processes, each with concurrency 1, would
still share the card.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout


class DeviceBusy(TimeoutError):
    pass


@dataclass(frozen=True)
class DeviceClaim:
    """The card a shard may use (``None``: the backend has no device to own)."""

    device: int | None
    slot: int | None = None

    def env(self) -> dict[str, str]:
        """What the shard process is told about its card."""
        return {} if self.device is None else {"CI_RELAY_DEVICE_INDEX": str(self.device)}


def _record_pid(fd: int) -> None:
    """Write the holder's pid into the slot file (read back only for the waiting message)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)


def _try_lock(path: Path) -> FileLock | None:
    lock = FileLock(path, timeout=0, on_acquired=_record_pid)
    try:
        lock.acquire()
    except Timeout:
        return None
    return lock


@contextmanager
def claim_device(
    backend: str,
    processes_per_device: int,
    devices: int,
    lock_dir: Path,
    *,
    timeout: float | None = None,
    poll: float = 0.2,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[DeviceClaim]:
    """Hold one of the backend's device slots for the duration of the block.

    ``processes_per_device == 0`` means no bound (the CPU): nothing is locked. Otherwise wait
    (polling) until a slot frees, telling ``on_wait`` once who holds them; ``DeviceBusy``
    after ``timeout`` seconds.
    """
    if processes_per_device <= 0:
        yield DeviceClaim(None)
        return
    lock_dir.mkdir(parents=True, exist_ok=True)
    slots = [(d, k) for k in range(processes_per_device) for d in range(devices)]
    deadline = None if timeout is None else time.monotonic() + timeout
    told = False
    while True:
        for device, slot in slots:
            path = lock_dir / f"{backend}-{device}.{slot}.lock"
            lock = _try_lock(path)
            if lock is None:
                continue
            try:
                yield DeviceClaim(device, slot)
            finally:
                lock.release()
            return
        if not told and on_wait is not None:
            holders = ", ".join(
                f"{p.name}: pid {p.read_text().strip() or '?'}"
                for p in sorted(lock_dir.glob(f"{backend}-*.lock"))
            )
            on_wait(f"every {backend} device slot is taken ({holders}); waiting")
            told = True
        if deadline is not None and time.monotonic() >= deadline:
            raise DeviceBusy(
                f"no free {backend} device after {timeout:g} s "
                f"({devices} device(s) x {processes_per_device} process(es) each, "
                f"locks in {lock_dir})"
            )
        time.sleep(poll)
