"""What an op name in a spec stands for: an OpInfo, an aten op, or one of the card's kernels.

torch-spyre's published support list mixes kinds of names: OpInfo names (``add``), OpInfo's
``nn.functional.*`` ops under their short name (``softplus``), aten names (``_scaled_mm``,
``convolution``) and the card's own kernel names (``realdiv``, ``topkvalue``). The profile
cross-check needs to know which one a name is before it can say whether the emulator runs it,
so names are resolved in this order, the first hit winning:

1. PyTorch's OpInfo database, by name or full name (``max.reduction_with_dim``), in every
   form :func:`reuse_specs.op_forms.opinfo_forms` gives (``softplus`` is
   ``nn.functional.softplus``), which is also how the specs' matching reads the name.
2. aten: ``name``, ``name.overload``, ``aten::name[.overload]`` or ``aten.name[.overload]``
   that ``torch.ops.aten`` has.
3. The card's kernel names in :data:`KERNEL_ALIASES_FILE` (each with its aten targets and why).

A name none of these know is :class:`Unresolved`, carrying every form tried, so a message can
say what was looked for instead of calling the name unknown.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from reuse_specs.op_forms import opinfo_forms

KERNEL_ALIASES_FILE = Path(__file__).with_name("kernel_aliases.yaml")


@dataclass(frozen=True)
class OpInfoName:
    """One or more OpInfos (every variant of a bare name) to trace."""

    name: str
    opinfos: tuple[Any, ...]

    @property
    def how(self) -> str:
        forms = sorted({o.full_name for o in self.opinfos})
        return f"OpInfo {', '.join(forms)}"


@dataclass(frozen=True)
class AtenName:
    """aten ops named directly, or through the card's kernel alias table."""

    name: str
    targets: tuple[str, ...]  # patterns as profiles write them: name or name.overload
    kernel_why: str | None = None  # set when the name is one of the card's kernels

    @property
    def how(self) -> str:
        aten = ", ".join(f"aten::{t}" for t in self.targets)
        if self.kernel_why is None:
            return f"aten op {aten}"
        return f"the card's kernel for {aten}: {self.kernel_why}"


@dataclass(frozen=True)
class Unresolved:
    """A name nothing knows; ``tried`` lists every form looked for."""

    name: str
    tried: tuple[str, ...]

    @property
    def how(self) -> str:
        return "tried " + "; ".join(self.tried)


Resolution = OpInfoName | AtenName | Unresolved


@dataclass(frozen=True)
class KernelAlias:
    aten: tuple[str, ...]
    why: str


def read_kernel_aliases(path: Path = KERNEL_ALIASES_FILE) -> dict[str, KernelAlias]:
    """The alias table: kernel name -> aten targets and why. A malformed table is an error
    naming the entry (it ships with the package; a user may point at their own)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the kernel alias table is a mapping of kernel names")
    table = {}
    for name, entry in data.items():
        ok = (
            isinstance(entry, dict)
            and set(entry) == {"aten", "why"}
            and isinstance(entry["aten"], list)
            and all(isinstance(a, str) and a for a in entry["aten"])
            and isinstance(entry["why"], str)
        )
        if not ok:
            raise ValueError(f"{path}: {name!r} needs exactly `aten: [op, ...]` and `why: text`")
        unknown = [a for a in entry["aten"] if aten_target(a) is None]
        if unknown:
            raise ValueError(
                f"{path}: {name!r} maps to {', '.join(f'aten::{a}' for a in unknown)}, which "
                f"torch {torch.__version__} does not have"
            )
        table[str(name)] = KernelAlias(tuple(entry["aten"]), entry["why"])
    return table


def aten_target(name: str) -> str | None:
    """``name`` or ``name.overload`` if ``torch.ops.aten`` has it, as a profile pattern."""
    base, _, overload = name.partition(".")
    if not base or not hasattr(torch.ops.aten, base):
        return None
    packet = getattr(torch.ops.aten, base)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return None
    if overload and overload not in packet.overloads():
        return None
    return name


def opinfo_aten_targets(opinfos: tuple[Any, ...]) -> tuple[str, ...]:
    """The aten ops OpInfos stand for without running them: each one's ``aten_name``
    (``torch._scaled_mm`` is ``_scaled_mm``), else its short name (``softplus``)."""
    found = (
        aten_target(o.aten_name.removeprefix("torch.")) or aten_target(o.name.rpartition(".")[2])
        for o in opinfos
    )
    return tuple(dict.fromkeys(a for a in found if a is not None))


class OpNames:
    """Resolves spec op names against one torch's OpInfo databases and aten, and the alias
    table. Build once per check: the OpInfo databases take seconds to import."""

    def __init__(self, opinfos: list[Any], aliases: dict[str, KernelAlias] | None = None):
        self._by_name: dict[str, list[Any]] = {}
        self._by_full_name: dict[str, Any] = {}
        for op in opinfos:
            self._by_name.setdefault(op.name, []).append(op)
            self._by_full_name.setdefault(op.full_name, op)
        self._aliases = read_kernel_aliases() if aliases is None else aliases

    def _opinfos(self, name: str, variant: bool) -> tuple[Any, ...]:
        """Every variant of ``name``; with ``variant``, the one full name only."""
        if variant:
            op = self._by_full_name.get(name)
            return (op,) if op is not None else ()
        return tuple(self._by_name.get(name, ())) or (
            (self._by_full_name[name],) if name in self._by_full_name else ()
        )

    def resolve(self, name: str, variant: bool = False) -> Resolution:
        """What ``name`` stands for (see the module docstring for the order)."""
        tried: list[str] = []
        forms = opinfo_forms(name)
        for form in forms:
            found = self._opinfos(form, variant)
            if found:
                return OpInfoName(name, found)
        tried.append(f"OpInfo {', '.join(forms)}")
        bare = name.strip()
        aten = bare.removeprefix("aten::").removeprefix("aten.")
        target = aten_target(aten)
        if target is not None:
            return AtenName(name, (target,))
        tried.append(f"aten::{aten}")
        alias = self._aliases.get(bare)
        if alias is not None:
            return AtenName(name, alias.aten, alias.why)
        tried.append(f"the card's kernel names in {KERNEL_ALIASES_FILE.name}")
        return Unresolved(name, tuple(tried))


@functools.cache
def opinfo_database() -> tuple[Any, ...]:
    """PyTorch's OpInfos and its ``_refs`` OpInfos (the second names ops ``_refs.*``)."""
    from torch.testing._internal.common_methods_invocations import op_db, python_ref_db

    return (*op_db, *python_ref_db)


def op_names() -> OpNames:
    """A resolver over the installed torch's databases and the bundled alias table."""
    return OpNames(list(opinfo_database()))
