"""PyTorch device test base for the emulated Spyre device (the ``TORCH_TEST_DEVICES`` file).

Run upstream device-generic tests on the emulator with::

    TORCH_TEST_DEVICES=/path/to/spyre_emu/device_test_base.py \\
    PYTORCH_TESTING_DEVICE_ONLY_FOR=privateuse1 python -m pytest test/test_foo.py

(``spyre_emu.upstream_test_env()`` returns exactly these two variables.)
``torch.testing._internal.common_device_type`` runs this file with ``runpy``
while it is being imported and appends ``TEST_CLASS`` to its device bases;
``PYTORCH_TESTING_DEVICE_ONLY_FOR=privateuse1`` then keeps only it. The file
loads the emulator itself, so nothing else has to be imported first; the class
is built as for a real card (``reuse_specs.devices.spyre_test_class``).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import spyre_emu
except ImportError:  # run by path from an environment without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import spyre_emu

from reuse_specs.devices.spyre_test_class import spyre_test_class

spyre_emu.load()

TEST_CLASS = spyre_test_class()
