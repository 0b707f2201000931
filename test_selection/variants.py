"""Executed test variants and the generic tests they instantiate.

Plans name generic tests (``file::TestX::test_y``) while results name executed variants
(``file::TestXCPU::test_y_cpu_float32``); the selector learns from results (durations,
failures) and the dashboard explains plans with outcomes, both through this matching.
"""

from __future__ import annotations

from collections.abc import Iterable


def split_nodeid(nodeid: str) -> tuple[str, str, str]:
    parts = nodeid.split("::")
    if len(parts) >= 3:
        return parts[0], parts[-2], parts[-1]
    if len(parts) == 2:
        return parts[0], "", parts[1]
    return "", "", nodeid


def match_variants(generic: Iterable[str], executed: Iterable[str]) -> dict[str, list[str]]:
    """Map each executed node id to the most specific generic test it instantiates.

    A variant's class starts with the generic class (``TestX`` -> ``TestXCPU``) and its
    name is the generic name or that name plus ``_suffix``; of several generic names
    that fit (``test_add`` and ``test_add_scalar``), the longest wins.
    """
    by_name: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for test in generic:
        file, cls, name = split_nodeid(test)
        by_name.setdefault((file, name), []).append((cls, test))
    out: dict[str, list[str]] = {}
    for nodeid in executed:
        file, cls, name = split_nodeid(nodeid)
        pieces = name.split("_")
        for cut in range(len(pieces), 0, -1):
            owners = by_name.get((file, "_".join(pieces[:cut])))
            owner = next((t for c, t in owners or () if cls.startswith(c)), None)
            if owner is not None:
                out.setdefault(owner, []).append(nodeid)
                break
    return out
