"""The forms one spec op name takes among OpInfo names.

torch-spyre's published support list names OpInfo's ``nn.functional.*`` ops by their short
name (``softplus`` for ``nn.functional.softplus``) and some ops by their ``torch.`` name
(``_scaled_mm`` for ``torch._scaled_mm``); OpInfo's reference-implementation variants are the
same op under ``_refs.``. So an entry of ``global.supported_ops`` stands for the variants of
any of these forms; an entry naming the form exactly wins over one naming it by short name.
"""

from __future__ import annotations

import functools

OPINFO_PREFIXES = ("", "nn.functional.", "torch.", "_refs.", "_refs.nn.functional.")
"""The prefixes OpInfo puts before an op's short name, in the order they are tried."""


@functools.cache
def opinfo_forms(name: str) -> tuple[str, ...]:
    """Every OpInfo name ``name`` may stand for, the name itself first. ``torch.`` and
    ``F.`` written in front are read as OpInfo's own spelling."""
    bare = name.strip()
    if bare.startswith("F."):
        bare = "nn.functional." + bare.removeprefix("F.")
    heads = [bare, bare.removeprefix("torch.")] if bare.startswith("torch.") else [bare]
    return tuple(dict.fromkeys(prefix + head for head in heads for prefix in OPINFO_PREFIXES))
