"""Write an emulator profile from a spec's ``global`` block: the card team's own list.

torch-spyre publishes what the card supports in the ``global`` block of its test configs;
the emulator should refuse exactly what that list refuses and run what it runs. This turns
such a block into a profile file:

- ``dtypes``: every dtype the block supports (``supported_dtypes`` and each op's own
  ``dtypes``, ``force_xfail`` ones left out), float16 first (the card's native format), and
  ``int64`` and ``bool`` always (indices and masks must exist on the device).
- ``supported_ops``: none, i.e. every op: the list names what was tested to work, not all the
  card runs, so an allowlist of it would fail upstream tests the card passes.
- ``unsupported_ops``: :data:`~spyre_emu.profile.NO_KERNEL_FAMILIES` except any family an op
  of the block reaches, plus the aten ops of the block's ``force_xfail`` ops (unless a
  supported op is the same aten op).
- ``source``: the spec's file name, its sha256, where it came from (``origin``), the command.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import torch
import yaml

from reuse_specs.schema import SpecFile, SupportedOp
from reuse_specs.yaml_source import load_yaml
from spyre_emu.op_names import AtenName, OpNames, Unresolved, aten_target, op_names
from spyre_emu.profile import NO_KERNEL_FAMILIES, SpyreProfile, dtype_name

ALWAYS_KEPT = ("int64", "bool")
"""Dtypes every generated profile keeps, whatever the list says (indices and masks)."""

GENERATOR = "ci-relay specs profile-from"


@dataclass(frozen=True)
class GeneratedProfile:
    """The profile, its file text, and what the generation decided that a reader should know."""

    profile: SpyreProfile
    text: str
    notes: tuple[str, ...]


def _aten_of(names: OpNames, op: SupportedOp) -> tuple[str, ...]:
    """The aten op patterns a spec op stands for, without running anything."""
    resolved = names.resolve(op.name)
    if isinstance(resolved, Unresolved):
        return ()
    if isinstance(resolved, AtenName):
        return resolved.targets
    found = (
        aten_target(o.aten_name.removeprefix("torch.")) or aten_target(o.name.rpartition(".")[2])
        for o in resolved.opinfos
    )
    return tuple(dict.fromkeys(a for a in found if a is not None))


def _ordered_dtypes(names: list[str]) -> list[str]:
    wanted = list(dict.fromkeys(names))
    for kept in ALWAYS_KEPT:
        if kept in wanted:
            wanted.remove(kept)
    first = ["float16"] if "float16" in wanted else []
    return first + [d for d in wanted if d != "float16"] + list(ALWAYS_KEPT)


def profile_from_spec(
    spec_path: Path, name: str | None = None, origin: str | None = None
) -> GeneratedProfile:
    """The profile that follows ``spec_path``'s ``global`` block (see the module docstring).
    The spec must already be valid (``specs check``); a block without supported dtypes is
    a ValueError: there is nothing to take a profile from."""
    raw = spec_path.read_bytes()
    doc = load_yaml(spec_path, str(spec_path))
    glob = SpecFile.model_validate(doc.data).test_suite_config.global_
    if not glob.supported_dtypes:
        raise ValueError(
            f"{spec_path}: its global block lists no supported_dtypes; a profile needs the "
            "card's dtypes"
        )
    notes: list[str] = []
    dtypes = [d.name for d in glob.supported_dtypes if not d.force_xfail]
    ops = list(glob.supported_ops or ())
    for op in ops:
        if not op.force_xfail:
            dtypes += [d.name for d in op.dtypes]
    names = op_names()
    supported_aten: set[str] = set()
    refused_aten: list[str] = []
    for op in ops:
        aten = _aten_of(names, op)
        if not aten and op.force_xfail:
            notes.append(
                f"force_xfail op {op.name!r}: no aten op found for it ("
                f"{names.resolve(op.name).how}), so the profile cannot refuse it"
            )
        if op.force_xfail:
            refused_aten += aten
        else:
            supported_aten.update(aten)
    families = []
    for family in sorted(NO_KERNEL_FAMILIES):
        hit = sorted(a for a in supported_aten if fnmatchcase(a.partition(".")[0], family))
        if hit:
            notes.append(f"{family!r} is not refused: the list supports {', '.join(hit)}")
        else:
            families.append(family)
    forced = [a for a in dict.fromkeys(refused_aten) if a not in supported_aten]
    profile_name = name or f"{spec_path.stem}-published"
    source = {
        "spec": spec_path.name,
        "sha256": hashlib.sha256(raw).hexdigest(),
        **({"origin": origin} if origin else {}),
        "generated_by": f"{GENERATOR} (torch {torch.__version__.split('+')[0]})",
    }
    body = {
        "name": profile_name,
        "source": source,
        "dtypes": _ordered_dtypes(dtypes),
        "supported_ops": None,
        "unsupported_ops": families + forced,
    }
    header = [
        f"# Generated by `{GENERATOR}` from the global block of",
        f"# {spec_path.name}; do not edit, regenerate it (README, 'The emulated Spyre device').",
        "# dtypes: what the list supports (int64 and bool always kept: indices and masks).",
        "# supported_ops: null = every op (the list names what was tested to work, not all the",
        "# card runs). unsupported_ops: op families the card has no kernels for and the list",
        "# never names (spyre_emu.profile.NO_KERNEL_FAMILIES), then the list's force_xfail ops.",
    ]
    text = "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False, width=100)
    profile = SpyreProfile(
        name=profile_name,
        dtypes=tuple(body["dtypes"]),  # type: ignore[arg-type]
        supported_ops=None,
        unsupported_ops=frozenset(families + forced),
        source=tuple((k, str(v)) for k, v in source.items()),
    )
    notes += [f"dtypes: {', '.join(dtype_name(d) for d in profile.dtypes)}"]
    return GeneratedProfile(profile, text, tuple(notes))
