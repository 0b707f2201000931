"""The PyTorch device test class for a ``spyre`` PrivateUse1 device, emulated or real.

Shared by the emulator's ``TORCH_TEST_DEVICES`` file (``spyre_emu/device_test_base.py``)
and the real card's (``spyre_card.py`` here), so upstream tests are named and
instantiated the same way on both: ``TestFoo`` -> ``TestFooSPYRE`` with tests
``test_bar_spyre_float16``. Call it only once the device is registered.

Why ``device_type = "spyre"`` rather than PyTorch's own ``PrivateUse1TestBase`` (which
PyTorch adds by itself when the backend is registered before ``common_device_type`` is
imported, and which names classes ``TestFooPRIVATEUSE1``): its ``device_type`` is
``"privateuse1"`` until its ``setUpClass`` first runs, but ``@dtypesIfPRIVATEUSE1`` stores
its list under ``"spyre"`` and PyTorch looks the list up by ``device_type`` while
instantiating, so the first test instantiated in a process would silently get the generic
dtypes. With ``"spyre"`` from the start the lookup is always right, and the class suffix
is the device's name.

Module-level flags PyTorch computed before the rename (``NATIVE_DEVICES``,
``TEST_PRIVATEUSE1``) are refreshed, because ``common_utils`` is imported before a
``TORCH_TEST_DEVICES`` file runs.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


def _module(name: str) -> Any:
    """The (possibly still importing) module ``name``: the caller runs inside its import."""
    module = sys.modules.get(name)
    return module if module is not None else importlib.import_module(name)


def spyre_test_class() -> type:
    """A device test base for the registered ``spyre`` device (``TEST_CLASS``)."""
    import torch

    name = torch._C._get_privateuse1_backend_name()
    device_mod = getattr(torch, name)
    common_utils = _module("torch.testing._internal.common_utils")
    common_device_type = _module("torch.testing._internal.common_device_type")
    if name not in common_utils.NATIVE_DEVICES:
        native = (*(d for d in common_utils.NATIVE_DEVICES if d != "privateuseone"), name)
        common_utils.NATIVE_DEVICES = native
        common_device_type.NATIVE_DEVICES = native
    common_utils.TEST_PRIVATEUSE1 = True
    common_utils.TEST_PRIVATEUSE1_DEVICE_TYPE = name
    common_utils.custom_device_mod = device_mod

    generic: Any = common_device_type.PrivateUse1TestBase
    # If the device was registered before common_device_type was imported, PyTorch
    # already added its generic PrivateUse1TestBase; keep only ours so each test is
    # instantiated once.
    bases = getattr(common_device_type, "device_type_test_bases", None)
    if bases is not None:
        bases[:] = [b for b in bases if b is not generic]

    class SpyreTestBase(generic):  # type: ignore[misc]
        """Device-generic tests on ``spyre:0``."""

        device_type = name
        primary_device = f"{name}:0"

        @classmethod
        def _apply_op_overrides(cls, ops: Any, test: Any = None) -> None:
            # the spec's edits.ops.include join the test's @ops list, as on torch-spyre
            from reuse_specs.op_includes import extend_op_list

            if test is not None:
                extend_op_list(ops, test)
            super()._apply_op_overrides(ops, test)

        @classmethod
        def setUpClass(cls) -> None:
            super().setUpClass()
            # Open the device (its process lock) once per class: a card held by another
            # process fails the class with the holder's pid, not each test.
            device_mod.init()

    SpyreTestBase.device_mod = device_mod
    return SpyreTestBase
