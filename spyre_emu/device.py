"""``torch.spyre``: the device module PyTorch and its test framework look up.

``spyre_emu.load`` registers this module as ``torch.spyre``. PyTorch calls it
for a PrivateUse1 backend: ``is_available`` (is the backend usable at all),
``current_device``/``device_count`` (``PrivateUse1TestBase`` builds
``spyre:0`` from them), ``_is_in_bad_fork``/``manual_seed_all`` (every
``torch.manual_seed``, hence every ``TestCase.setUp``), ``get_rng_state``/
``set_rng_state`` (``torch.random.fork_rng``), ``get_amp_supported_dtype``
(autocast). The rest mirrors ``torch.cuda`` where tests call it directly.

The device has its own random generator (a CPU generator, since the work runs
on the CPU) so that seeding, saving and restoring the device's random state is
independent of the CPU's, as on a real accelerator.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from spyre_emu import _lock

NAME = "spyre"
DEVICE_COUNT = 1

_generator: Any = torch.Generator()


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    """Whether this process has opened the device (and so holds its lock)."""
    return _lock.is_held(0)


def init() -> None:
    """Open the device now: take its lock, or raise ``DeviceBusyError``.

    Opening is otherwise lazy (the first tensor allocated on the device), so
    that importing or collecting tests does not claim the card.
    """
    _lock.acquire(0)


def _check_index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        index = device
    else:
        dev = torch.device(device)
        if dev.type != NAME:
            raise ValueError(f"expected a {NAME} device, got {dev}")
        index = 0 if dev.index is None else dev.index
    if not 0 <= index < DEVICE_COUNT:
        raise RuntimeError(
            f"Invalid device index {index}: the emulated {NAME} backend has "
            f"{DEVICE_COUNT} device ({NAME}:0)"
        )
    return index


def device_count() -> int:
    return DEVICE_COUNT


def current_device() -> int:
    return 0


def set_device(device: Any) -> None:
    _check_index(device)


@contextmanager
def device(device: Any) -> Iterator[None]:
    """Context manager selecting a device; there is only ``spyre:0``."""
    _check_index(device)
    yield


def synchronize(device: Any = None) -> None:
    """Work runs synchronously on the CPU: nothing to wait for."""
    _check_index(device)


def empty_cache() -> None:
    """No caching allocator to trim: device memory is CPU memory."""


def get_amp_supported_dtype() -> list[Any]:
    return [torch.float16]


def _is_in_bad_fork() -> bool:
    return False


def manual_seed(seed: int) -> None:
    _generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    _generator.manual_seed(int(seed))


def seed() -> None:
    _generator.seed()


def seed_all() -> None:
    _generator.seed()


def initial_seed() -> int:
    return int(_generator.initial_seed())


def get_rng_state(device: Any = NAME) -> Any:
    _check_index(device)
    return _generator.get_state()


def set_rng_state(new_state: Any, device: Any = NAME) -> None:
    _check_index(device)
    _generator.set_state(new_state)


def generator() -> Any:
    """The generator random ops on the device draw from when given none."""
    return _generator
