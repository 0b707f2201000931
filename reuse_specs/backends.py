"""Backend profiles: how a device's tests are instantiated and how many may share it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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

    @property
    def class_suffix(self) -> str:
        """Suffix torch appends to a generic test class for this device."""
        return self.device_type.upper()


BACKENDS: dict[str, Backend] = {
    "cpu": Backend(
        name="cpu",
        device_type="cpu",
        description="upstream tests on the CPU (reference results, no accelerator)",
        env={"PYTORCH_TESTING_DEVICE_ONLY_FOR": "cpu"},
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
