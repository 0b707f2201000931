"""spyre-emu: an emulated IBM Spyre device for PyTorch, executing on the CPU.

``spyre_emu.load()`` registers PrivateUse1 as ``spyre`` from Python: tensors
report ``spyre:0``, move with ``.to("spyre")``/``.cpu()``, keep their own data,
support views, in-place ops and autograd, and obey a ``SpyreProfile`` (the
card's dtypes and operators; anything outside it raises instead of running).
Upstream device-generic tests run on it through ``TORCH_TEST_DEVICES`` (see
``upstream_test_env``). Environment: ``SPYRE_EMU_PROFILE`` (profile YAML, default
built in), ``SPYRE_EMU_LOCK_DIR`` (where the per-device lock files live).
"""

from __future__ import annotations

from pathlib import Path

from spyre_emu._backend import load, loaded_profile
from spyre_emu._dispatch import SpyreTensor
from spyre_emu._lock import LOCK_DIR_ENV, lock_path
from spyre_emu.errors import (
    DeviceBusyError,
    LoadError,
    ProfileError,
    SpyreEmuError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from spyre_emu.profile import (
    DEFAULT_PROFILE,
    ESSENTIAL_OPS,
    PROFILE_ENV,
    SpyreProfile,
    load_profile_file,
    profile_from_env,
)

TEST_DEVICES_FILE = Path(__file__).resolve().with_name("device_test_base.py")


def upstream_test_env() -> dict[str, str]:
    """Environment that makes PyTorch's test framework instantiate tests for spyre only."""
    return {
        "TORCH_TEST_DEVICES": str(TEST_DEVICES_FILE),
        "PYTORCH_TESTING_DEVICE_ONLY_FOR": "privateuse1",
    }


__all__ = [
    "DEFAULT_PROFILE",
    "ESSENTIAL_OPS",
    "LOCK_DIR_ENV",
    "PROFILE_ENV",
    "TEST_DEVICES_FILE",
    "DeviceBusyError",
    "LoadError",
    "ProfileError",
    "SpyreEmuError",
    "SpyreProfile",
    "SpyreTensor",
    "UnsupportedDtypeError",
    "UnsupportedOpError",
    "load",
    "load_profile_file",
    "loaded_profile",
    "lock_path",
    "profile_from_env",
    "upstream_test_env",
]
