"""Backend profiles: how a device's tests are instantiated and how many may share it."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

SPYRE_DEVICE_GLOB = "vfio/[0-9]*"  # where a Spyre card appears under /dev by default


@dataclass(frozen=True)
class Backend:
    """A device the upstream tests run on.

    ``device_type`` is the name torch gives the device in instantiated test
    names (``cpu`` -> ``TestFooCPU.test_bar_cpu``); ``env`` is what PyTorch's
    test framework reads to pick that device; ``processes_per_device`` bounds
    parallel pytest processes on one device (0 = no bound).
    """

    name: str
    device_type: str
    description: str
    env: Mapping[str, str] = field(default_factory=dict)
    processes_per_device: int = 0
    preflight: Callable[[str], None] | None = None  # called with the cards' /dev pattern
    env_defaults: Mapping[str, str] = field(default_factory=dict)  # unless already set

    def apply_env(self, environ: MutableMapping[str, str]) -> None:
        """Set what PyTorch's test framework (and the device) read for this backend."""
        environ.update(self.env)
        for key, value in self.env_defaults.items():
            environ.setdefault(key, value)

    def check(self, device_glob: str = SPYRE_DEVICE_GLOB) -> None:
        """Refuse clearly, before any test runs, when this machine cannot run the backend
        (``device_glob``: where its cards appear under /dev, the relay's settings say)."""
        if self.preflight is not None:
            self.preflight(device_glob)

    @property
    def class_suffix(self) -> str:
        """Suffix torch appends to a generic test class for this device."""
        return self.device_type.upper()


class BackendUnavailable(RuntimeError):
    pass


def _spyre_emu_ready(_device_glob: str) -> None:
    if importlib.util.find_spec("spyre_emu") is None:
        raise BackendUnavailable("the spyre-emu backend needs the spyre_emu package (ci-relay's)")
    if importlib.util.find_spec("torch") is None:
        raise BackendUnavailable("the spyre-emu backend needs torch (pip install torch==2.13.0)")


def _spyre_card_ready(device_glob: str) -> None:
    if importlib.util.find_spec("torch_spyre") is None:
        raise BackendUnavailable(
            "the spyre backend needs torch-spyre installed and a Spyre card "
            "(the runner image: ci-relay images build --backend spyre); "
            "without a card use --backend spyre-emu"
        )
    if not any(Path("/dev").glob(device_glob)):
        raise BackendUnavailable(
            "the spyre backend found no Spyre card (no /dev/vfio device; "
            "CI_RELAY_SPYRE_DEVICE_GLOB names another pattern under /dev)"
        )


_SPYRE_DEVICES = Path(__file__).resolve().parent / "devices"
_SPYRE_EMU_DEVICES = Path(__file__).resolve().parent.parent / "spyre_emu" / "device_test_base.py"

BACKENDS: dict[str, Backend] = {
    "cpu": Backend(
        name="cpu",
        device_type="cpu",
        description="upstream tests on the CPU (reference results, no accelerator)",
        env={"PYTORCH_TESTING_DEVICE_ONLY_FOR": "cpu"},
    ),
    "spyre-emu": Backend(
        name="spyre-emu",
        device_type="spyre",
        description="the emulated Spyre device (spyre_emu: PrivateUse1 from Python, on the CPU)",
        env={
            "TORCH_TEST_DEVICES": str(_SPYRE_EMU_DEVICES),
            "PYTORCH_TESTING_DEVICE_ONLY_FOR": "privateuse1",
        },
        processes_per_device=1,
        preflight=_spyre_emu_ready,
    ),
    "spyre": Backend(
        name="spyre",
        device_type="spyre",
        description="a real Spyre card through torch-spyre",
        env={
            "TORCH_TEST_DEVICES": str(_SPYRE_DEVICES / "spyre_card.py"),
            "PYTORCH_TESTING_DEVICE_ONLY_FOR": "privateuse1",
        },
        processes_per_device=1,
        preflight=_spyre_card_ready,
    ),
}


class UnknownBackend(KeyError):
    def __str__(self) -> str:
        return f"unknown backend {self.args[0]!r} (known: {', '.join(sorted(BACKENDS))})"


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UnknownBackend(name) from None
