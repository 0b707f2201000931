"""Dtype names as torch spells them, checked without importing torch.

Spec validation must be fast and must work where torch is not installed (a
lint job), so the names are a table; ``tests/test_dtypes.py`` checks the table
against the installed torch so it cannot drift silently.
"""

from __future__ import annotations

import difflib

# canonical name -> aliases torch also accepts as attributes (torch.half, ...)
CANONICAL_DTYPES: dict[str, tuple[str, ...]] = {
    "bool": (),
    "uint8": (),
    "uint16": (),
    "uint32": (),
    "uint64": (),
    "int8": (),
    "int16": ("short",),
    "int32": ("int",),
    "int64": ("long",),
    "float16": ("half",),
    "bfloat16": (),
    "float32": ("float",),
    "float64": ("double",),
    "complex32": ("chalf",),
    "complex64": ("cfloat",),
    "complex128": ("cdouble",),
    "float8_e4m3fn": (),
    "float8_e4m3fnuz": (),
    "float8_e5m2": (),
    "float8_e5m2fnuz": (),
    "float8_e8m0fnu": (),
    "float4_e2m1fn_x2": (),
    "quint8": (),
    "qint8": (),
    "qint32": (),
    "quint4x2": (),
    "quint2x4": (),
    **{f"int{n}": () for n in range(1, 8)},
    "uint1": ("bit",),
    **{f"uint{n}": () for n in range(2, 8)},
    "bits1x8": (),
    "bits2x4": (),
    "bits4x2": (),
    "bits8": (),
    "bits16": (),
}

_ALIASES: dict[str, str] = {
    alias: canonical for canonical, aliases in CANONICAL_DTYPES.items() for alias in aliases
}


def canonical_dtype(name: str) -> str | None:
    """``"half"`` / ``"torch.float16"`` -> ``"float16"``; None when torch has no such dtype."""
    bare = name.removeprefix("torch.")
    if bare in CANONICAL_DTYPES:
        return bare
    return _ALIASES.get(bare)


def unknown_dtype_message(name: str) -> str:
    """A one-line explanation with the nearest valid names."""
    known = sorted({*CANONICAL_DTYPES, *_ALIASES})
    close = difflib.get_close_matches(name.removeprefix("torch."), known, n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown dtype {name!r}: torch has no dtype of that name{hint}"


def dtype_name_of(dtype: object) -> str:
    """Canonical name of a ``torch.dtype`` object (``torch.float16`` -> ``float16``)."""
    return str(dtype).removeprefix("torch.")
