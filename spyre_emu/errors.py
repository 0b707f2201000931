"""Errors the emulator raises, typed so tests and callers can tell them apart.

Each one is also an instance of the builtin PyTorch itself raises in the same
situation, so upstream tests written against a real backend
(``assertRaises(RuntimeError)``, ``except NotImplementedError``) see the same
behaviour on the emulated device.
"""

from __future__ import annotations


class SpyreEmuError(Exception):
    """Base class of every error specific to the emulator."""


class ProfileError(SpyreEmuError, ValueError):
    """A profile (YAML file or ``SpyreProfile`` arguments) is invalid."""


class LoadError(SpyreEmuError, RuntimeError):
    """The emulator cannot be registered in this process (see ``spyre_emu.load``)."""


class DeviceBusyError(SpyreEmuError, RuntimeError):
    """Another process holds the emulated device: one process per card, as on Spyre."""


class UnsupportedDtypeError(SpyreEmuError, TypeError, RuntimeError):
    """A tensor of a dtype outside the profile would live on the device.

    A ``TypeError`` because the dtype is the problem, and a ``RuntimeError``
    because that is what PyTorch raises for dtypes a backend lacks kernels for.
    """


class UnsupportedOpError(SpyreEmuError, NotImplementedError):
    """An operator outside the profile's supported set ran on the device.

    ``NotImplementedError`` is what PyTorch raises for a missing backend kernel.
    """
