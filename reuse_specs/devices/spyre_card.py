"""``TORCH_TEST_DEVICES`` file for a real Spyre card (the ``spyre`` backend).

torch-spyre registers PrivateUse1 as ``spyre`` when imported; the test class is the one the
emulator uses (``reuse_specs.devices.spyre_test_class``, beside this file so the real card's
path never imports the emulator), so names match between ``spyre-emu`` and ``spyre`` runs and
one reuse spec serves both.
"""

from __future__ import annotations

import torch

try:
    import torch_spyre  # noqa: F401  (registers the device)
except ImportError as exc:
    raise RuntimeError(
        "the spyre backend needs torch-spyre installed (and a Spyre card); "
        "without one use --backend spyre-emu"
    ) from exc

from reuse_specs.devices.spyre_test_class import spyre_test_class

if torch._C._get_privateuse1_backend_name() != "spyre":
    raise RuntimeError("torch-spyre did not register the spyre device")

TEST_CLASS = spyre_test_class()
