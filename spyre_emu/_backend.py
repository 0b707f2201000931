"""Registering the emulated device in a process: once, with one profile.

PrivateUse1 can be renamed only once per process and the registration cannot
be undone, so loading is idempotent for the same profile and an error for
anything else: a different profile (the ops already ran under the first one),
or PrivateUse1 already taken by another backend (including a real torch-spyre,
which cannot share a process with the emulator).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from spyre_emu import _dispatch
from spyre_emu import device as device_module
from spyre_emu.errors import LoadError
from spyre_emu.profile import SpyreProfile, profile_from_env

_UNRENAMED = "privateuseone"


class _Hooks(torch._C._acc.PrivateUse1Hooks):  # type: ignore[misc]
    """What PyTorch's C++ side asks a PrivateUse1 backend: it exists and is usable."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):  # type: ignore[misc]
    def type_(self) -> Any:
        return torch._C._autograd.DeviceType.PrivateUse1


_lock = threading.Lock()
_loaded: SpyreProfile | None = None
_keep_alive: list[Any] = []


def loaded_profile() -> SpyreProfile | None:
    """The profile the emulator runs with in this process, or None if not loaded."""
    return _loaded


def load(profile: SpyreProfile | None = None) -> SpyreProfile:
    """Register the ``spyre`` device in this process and return its profile.

    ``profile`` defaults to ``SPYRE_EMU_PROFILE`` (see ``profile_from_env``).
    Calling again is a no-op when ``profile`` is None or equal to the loaded
    one; a different profile raises ``LoadError``, as does a PrivateUse1
    backend already registered under any name by someone else.
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            if profile is None or profile == _loaded:
                return _loaded
            raise LoadError(
                f"spyre-emu is already loaded in this process with profile {_loaded.name!r} "
                f"({_loaded}); it cannot switch to profile {profile.name!r} ({profile}): "
                "the device's kernels and registration last for the process. Start a new "
                "process for another profile."
            )
        current = torch._C._get_privateuse1_backend_name()
        if current != _UNRENAMED:
            owner = getattr(torch, current, None)
            raise LoadError(
                f"PrivateUse1 is already registered as {current!r} in this process "
                f"(torch.{current} = {owner!r}); spyre-emu needs it as "
                f"{device_module.NAME!r} and PyTorch allows one PrivateUse1 backend per "
                "process. Load the emulator in a process without another backend."
            )
        wanted = profile if profile is not None else profile_from_env()
        hooks, guard = _Hooks(), _DeviceGuard()
        torch.utils.backend_registration._setup_privateuseone_for_python_backend(
            rename=device_module.NAME,
            backend_module=device_module,
            hook=hooks,
            device_guard=guard,
        )
        _dispatch.install(wanted)
        library = torch.library.Library("_", "IMPL")
        library.fallback(_dispatch.factory_fallback, "PrivateUse1", with_keyset=True)
        kernels = torch.library.Library("aten", "IMPL")
        kernels.impl("copy_", _dispatch.copy_kernel, "PrivateUse1")
        _keep_alive.extend([hooks, guard, library, kernels])
        _loaded = wanted
        return wanted
