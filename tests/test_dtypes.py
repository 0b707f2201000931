"""The dtype-name table must match the installed torch exactly."""

from __future__ import annotations

import torch

from reuse_specs.dtypes import CANONICAL_DTYPES, canonical_dtype, dtype_name_of


def test_table_matches_torch() -> None:
    torch_names = {name for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)}
    ours = set(CANONICAL_DTYPES) | {a for aliases in CANONICAL_DTYPES.values() for a in aliases}
    # every name we accept exists in torch...
    assert ours <= torch_names, ours - torch_names
    # ...and every torch dtype is accepted, by its canonical name
    canonical_torch = {dtype_name_of(getattr(torch, name)) for name in torch_names}
    assert canonical_torch <= set(CANONICAL_DTYPES), canonical_torch - set(CANONICAL_DTYPES)
    for name in torch_names:
        assert canonical_dtype(name) == dtype_name_of(getattr(torch, name)), name
    assert canonical_dtype("torch.half") == "float16"
    assert canonical_dtype("float17") is None
