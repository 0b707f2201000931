"""What the emulated card can do: its dtypes and its operators.

The emulator executes everything on the CPU, so without limits it would pass
tests a real Spyre card fails. A profile states the card's limits; the device
enforces them loudly (an error naming the dtype or the operator), never by
computing something the card could not.

The default profile is :data:`DEFAULT_PROFILE_FILE`, written by ``ci-relay specs
profile-from`` from torch-spyre's published support list (the ``global`` block of
its ``upstream_tests_beta`` configs; the file records which one, at which commit,
with its sha256). Regenerate it when that list changes (README, "The emulated
Spyre device"). From the list it takes the dtypes: bfloat16, bool, float16,
float32, int64 (``int64`` and ``bool`` are kept by every generated profile:
indices and masks must exist on the device). It allows every op, because the
list names what the team has tested to work, not everything the card runs, and
refuses only :data:`NO_KERNEL_FAMILIES` (op families the list never names and the
card has no kernels for) plus the list's ``force_xfail`` ops.

Operators are aten names as they reach the device, i.e. after PyTorch's
composite decompositions: ``torch.linalg.norm`` arrives as
``linalg_vector_norm``. A pattern matches ``add`` (every overload),
``add.Tensor`` (one overload) or ``aten::add``, with shell wildcards
(``_fft_*``). ``supported_ops`` (when given) is an allowlist;
``unsupported_ops`` removes ops from whatever is allowed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import torch
import yaml

from spyre_emu.errors import ProfileError

PROFILE_ENV = "SPYRE_EMU_PROFILE"

DEFAULT_PROFILE_FILE = Path(__file__).with_name("default_profile.yaml")

NO_KERNEL_FAMILIES: frozenset[str] = frozenset(
    {
        # FFTs
        "_fft_*",
        # factorizations, solvers, eigen/singular values
        "_linalg_det",
        "_linalg_eigh",
        "_linalg_slogdet",
        "_linalg_solve_ex",
        "_linalg_svd",
        "cholesky*",
        "geqrf",
        "linalg_cholesky_ex",
        "linalg_eig",
        "linalg_householder_product",
        "linalg_inv_ex",
        "linalg_ldl_*",
        "linalg_lstsq",
        "linalg_lu*",
        "linalg_qr",
        "linalg_solve_triangular",
        "lu_unpack",
        "ormqr",
        "triangular_solve",
        # sparse layouts
        "_sparse_*",
        "_to_sparse*",
        "sparse_*",
        "to_sparse*",
    }
)
"""Op families the card has no kernels for and torch-spyre's list never names: FFTs, dense
factorizations and solvers, sparse layouts. A generated profile refuses them unless the
spec it comes from supports one."""

# Plumbing every backend has, whatever its kernels: allocation, copies in and
# out, metadata-only views, reading a scalar. Allowed by any profile so that
# tensors can exist, move, print and carry gradients.
ESSENTIAL_OPS: frozenset[str] = frozenset(
    {
        "_local_scalar_dense",
        "_to_copy",
        "_unsafe_view",
        "alias",
        "as_strided",
        "copy_",
        "detach",
        "empty.memory_format",
        "empty_like",
        "empty_strided",
        "lift_fresh",
        "new_empty",
        "new_empty_strided",
        "resize_",
        "view",
    }
)

_KEYS = {"name", "source", "dtypes", "supported_ops", "unsupported_ops"}


def _dtype(name: object, where: str) -> Any:
    value = getattr(torch, name, None) if isinstance(name, str) else name
    if not isinstance(value, torch.dtype):
        raise ProfileError(f"{where}: {name!r} is not a torch dtype (e.g. float16, int64, bool)")
    return value


def dtype_name(dtype: Any) -> str:
    """``torch.float16`` -> ``float16``: how profiles and messages spell dtypes."""
    return str(dtype).removeprefix("torch.")


def _patterns(values: object, where: str) -> frozenset[str]:
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise ProfileError(f"{where}: expected a list of op names, got {values!r}")
    out = []
    for value in values:
        if not isinstance(value, str) or not value.strip():
            raise ProfileError(f"{where}: op names are non-empty strings, got {value!r}")
        out.append(value.strip())
    return frozenset(out)


def _matches(patterns: frozenset[str], names: tuple[str, ...]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns for name in names)


def read_profile_data(file: Path) -> dict[str, Any]:
    """A profile file's mapping, its keys checked (unknown keys are errors, not silence)."""
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"{file}: cannot read the profile: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{file}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(f"{file}: a profile is a mapping, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - _KEYS)
    if unknown:
        raise ProfileError(f"{file}: unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
    return data


def _source(value: object, where: str) -> tuple[tuple[str, str], ...]:
    """``source``: where a generated profile came from, as text pairs (only recorded)."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str | int) for k, v in value.items()
    ):
        raise ProfileError(f"{where}: source is a mapping of names to text, got {value!r}")
    return tuple((k, str(v)) for k, v in value.items())


_DEFAULT_DATA = read_profile_data(DEFAULT_PROFILE_FILE)
DEFAULT_NAME: str = str(_DEFAULT_DATA["name"])
DEFAULT_DTYPES: tuple[Any, ...] = tuple(
    _dtype(d, f"{DEFAULT_PROFILE_FILE} dtypes") for d in _DEFAULT_DATA["dtypes"]
)
DEFAULT_UNSUPPORTED_OPS: frozenset[str] = _patterns(
    _DEFAULT_DATA["unsupported_ops"], f"{DEFAULT_PROFILE_FILE} unsupported_ops"
)


@dataclass(frozen=True)
class SpyreProfile:
    """The limits of the emulated card; equal profiles are interchangeable.

    ``dtypes`` are the dtypes a device tensor may have (the first is the
    card's preferred one); ``supported_ops`` is an allowlist of aten op
    patterns (None = every op); ``unsupported_ops`` patterns are refused even
    if allowed otherwise. See the module docstring for the pattern syntax.
    Omitted, ``name``, ``dtypes`` and ``unsupported_ops`` are the default profile's, so
    ``SpyreProfile()`` equals :data:`DEFAULT_PROFILE`.
    ``source`` records where a generated profile came from; it decides nothing.
    """

    name: str = DEFAULT_NAME
    dtypes: tuple[Any, ...] = DEFAULT_DTYPES
    supported_ops: frozenset[str] | None = None
    unsupported_ops: frozenset[str] = field(default=DEFAULT_UNSUPPORTED_OPS)
    source: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        where = f"profile {self.name!r}"
        dtypes = tuple(_dtype(d, f"{where} dtypes") for d in self.dtypes)
        if not dtypes:
            raise ProfileError(f"{where}: dtypes is empty; a device needs at least one dtype")
        if len(set(dtypes)) != len(dtypes):
            raise ProfileError(f"{where}: dtypes lists a dtype twice: {self.dtype_names}")
        object.__setattr__(self, "dtypes", dtypes)
        if self.supported_ops is not None:
            patterns = _patterns(self.supported_ops, f"{where} supported_ops")
            object.__setattr__(self, "supported_ops", patterns)
        object.__setattr__(
            self, "unsupported_ops", _patterns(self.unsupported_ops, f"{where} unsupported_ops")
        )

    @property
    def dtype_names(self) -> str:
        return ", ".join(dtype_name(d) for d in self.dtypes)

    def allows_op(self, qualified_name: str, overload: str) -> bool:
        """Whether ``namespace::name`` (overload ``overload``) may run on the device."""
        namespace, _, name = qualified_name.partition("::")
        full = f"{name}.{overload}"
        names = (name, full, qualified_name, f"{qualified_name}.{overload}")
        if namespace == "aten" and (name in ESSENTIAL_OPS or full in ESSENTIAL_OPS):
            return True
        if self.supported_ops is not None and not _matches(self.supported_ops, names):
            return False
        return not _matches(self.unsupported_ops, names)


def load_profile_file(path: str | os.PathLike[str]) -> SpyreProfile:
    """Read a profile from YAML (keys: name, source, dtypes, supported_ops, unsupported_ops).

    Omitted keys keep the default profile's value; ``supported_ops: null`` (or
    omitting it) allows every op; unknown keys are errors, not silence.
    """
    file = Path(path)
    return _profile_from_data(read_profile_data(file), file)


def _profile_from_data(data: dict[str, Any], file: Path) -> SpyreProfile:
    """A profile from a file's checked mapping (see :func:`load_profile_file`)."""
    kwargs: dict[str, Any] = {"name": str(data.get("name", file.stem))}
    if "dtypes" in data:
        if not isinstance(data["dtypes"], list):
            raise ProfileError(f"{file}: dtypes is a list of dtype names")
        kwargs["dtypes"] = tuple(data["dtypes"])
    if data.get("supported_ops") is not None:
        kwargs["supported_ops"] = data["supported_ops"]
    if "unsupported_ops" in data:
        kwargs["unsupported_ops"] = data["unsupported_ops"] or ()
    if "source" in data:
        kwargs["source"] = _source(data["source"], str(file))
    try:
        return SpyreProfile(**kwargs)
    except ProfileError as exc:
        raise ProfileError(f"{file}: {exc}") from None


DEFAULT_PROFILE = _profile_from_data(_DEFAULT_DATA, DEFAULT_PROFILE_FILE)  # parsed once


def profile_from_env() -> SpyreProfile:
    """The profile ``SPYRE_EMU_PROFILE`` names: unset, empty or ``default`` is the default."""
    value = os.environ.get(PROFILE_ENV, "").strip()
    if value in ("", "default"):
        return DEFAULT_PROFILE
    return load_profile_file(value)
