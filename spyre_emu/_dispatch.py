"""The emulated device's tensors and how every operator on them runs.

A device tensor is a wrapper subclass (``SpyreTensor``): it carries the
metadata PyTorch reports (device ``spyre:0``, shape, true strides, storage
offset, dtype) and keeps its data in a private CPU tensor. Autograd,
view tracking and version counters work on the wrapper as for any device,
because they run above the Python dispatch key; ``__torch_dispatch__`` then
unwraps the arguments, runs the aten op on the CPU tensors and wraps the
results. Ops that create tensors from nothing (``torch.empty(...,
device="spyre")``) reach the PrivateUse1 boxed fallback instead, which runs
them on the CPU and wraps the result.

Per-op decisions (is the op allowed, does it write to an argument, take a
device or a generator) are made once per ``OpOverload`` and cached as a
closure, so the per-call path is a dict lookup, one pass over the arguments
and one wrap per result.

Over 400 lines on purpose: the wrapper type, its dispatch and the per-op decisions are one
hot path whose invariants (what is wrapped, when data is copied) must be read together.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from spyre_emu import device as device_module
from spyre_emu.errors import UnsupportedDtypeError, UnsupportedOpError
from spyre_emu.profile import DEFAULT_PROFILE, SpyreProfile, dtype_name

_CPU = torch.device("cpu")
_Tensor = torch.Tensor
_make_wrapper = torch.Tensor._make_wrapper_subclass
_TENSOR_DATA = torch._C.TensorBase.data

Plan = Callable[[tuple[Any, ...], dict[str, Any]], Any]


class _State:
    """Mutable module state, set by ``install``."""

    profile: SpyreProfile = DEFAULT_PROFILE
    dtypes: frozenset[Any] = frozenset(DEFAULT_PROFILE.dtypes)
    device: Any = None
    relaxed: int = 0


_state = _State()
_plans: dict[Any, Plan] = {}

# Ops that may mix device tensors with CPU tensors of any shape: copies between
# devices, and indexing with host index tensors (accelerators accept those).
_MIXED_DEVICE_OK = frozenset(
    {
        "aten::_copy_from",
        "aten::_copy_from_and_resize",
        "aten::_index_put_impl_",
        "aten::_to_copy",
        "aten::copy_",
        "aten::index",
        "aten::index_put",
        "aten::index_put_",
    }
)


class SpyreTensor(torch.Tensor):  # type: ignore[misc]
    """A tensor on the emulated ``spyre`` device; its data lives in ``_cpu``."""

    __slots__ = ("_cpu",)
    _cpu: Any

    # No per-call Python __torch_function__ layer: everything is handled at
    # the dispatcher level, which is both cheaper and sees decomposed ops.
    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        # PyTorch formats a tensor by running ops on its device, including a
        # float64 copy for the number layout; allow that for display only.
        with relaxed():
            text = str(super().__repr__(tensor_contents=tensor_contents))
        # Print as ``tensor(..., device='spyre:0')`` like any device tensor,
        # not under the wrapper's class name.
        prefix = f"{type(self).__name__}("
        if not text.startswith(prefix):
            return text
        shift = " " * (len(prefix) - len("tensor("))
        lines = text[len(prefix) :].split("\n")
        rest = [line.removeprefix(shift) for line in lines[1:]]
        return "\n".join(["tensor(" + lines[0], *rest])

    def __format__(self, format_spec: str) -> str:
        if self.dim() == 0:
            return format(self.item(), format_spec)
        return object.__format__(self, format_spec)

    @property
    def data(self) -> Any:
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, new: Any) -> None:
        # ``t.data = other`` (Module.to/half, optimizers, init code) swaps the
        # tensor's metadata in place; the host data has to follow.
        if type(new) is not SpyreTensor:
            raise RuntimeError(
                f"cannot set .data of a spyre tensor to a tensor on {new.device}: the emulated "
                "device keeps device tensors and host tensors apart; move it with .to('spyre')"
            )
        _TENSOR_DATA.__set__(self, new)
        self._cpu = new._cpu

    def tolist(self) -> Any:
        """Read the values back to the host, as ``tolist`` does on any device."""
        return self.detach()._cpu.tolist()

    def numpy(self, *, force: bool = False) -> Any:
        """Like any device tensor: refuse unless forced, pointing at ``.cpu()``."""
        if force:
            return self.detach()._cpu.numpy(force=True)
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to "
            "copy the tensor to host memory first."
        )

    def data_ptr(self) -> int:
        """The address of the data in host memory: views share their base's."""
        return int(self._cpu.data_ptr())

    def untyped_storage(self) -> Any:
        """The host storage holding the data (its ``device`` says cpu).

        The wrapper's own storage has no data; handing it out lets PyTorch
        read through a null pointer (``storage().clone()`` crashes). The host
        storage answers what storage users ask (aliasing, size) truthfully.
        """
        return self._cpu.untyped_storage()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        # PyTorch's default path copies the (data-less) wrapper storage.
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the "
                "deepcopy protocol at the moment."
            )
        with torch.no_grad():
            new = self.clone()
        new.requires_grad_(self.requires_grad)
        memo[id(self)] = new
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickle the host data and move it back to the device when loaded,
        # with PyTorch's own rebuild function (allowed by weights_only loads).
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self._cpu, self.dtype, str(self.device), self.requires_grad),
        )

    @classmethod
    def __torch_dispatch__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        plan = _plans.get(func)
        if plan is None:
            plan = _plan(func)
        try:
            return plan(args, kwargs or {})
        except Exception as exc:
            if _current_autograd_node() is None:
                raise
            return _BackwardError(exc)


_current_autograd_node = torch._C._current_autograd_node


class _BackwardError:
    """Stands in for the result of an op that failed while computing gradients.

    PyTorch's autograd engine holds a stream guard of the Python-registered
    device while it runs a backward function; a Python exception unwinding
    through that guard aborts the whole process (``std::terminate``). So inside
    backward the emulator returns this object instead of raising: PyTorch
    fails to use it as the op's result and raises a ``RuntimeError`` (a C++
    error, which unwinds safely) whose message carries ``repr`` of this
    object, i.e. the original error.
    """

    def __init__(self, exc: BaseException) -> None:
        self.message = f"{type(exc).__name__}: {exc}"

    def __repr__(self) -> str:
        return f"[spyre-emu error while computing gradients] {self.message}"


@contextmanager
def relaxed() -> Iterator[None]:
    """Allow any op and dtype on the device while inside (used for printing only)."""
    _state.relaxed += 1
    try:
        yield
    finally:
        _state.relaxed -= 1


def _op_name(func: Any) -> str:
    overload = func._overloadname
    return str(func._schema.name) + ("" if overload == "default" else f".{overload}")


def _unsupported_dtype(dtype: Any, func: Any) -> UnsupportedDtypeError:
    profile = _state.profile
    return UnsupportedDtypeError(
        f"dtype {dtype_name(dtype)} is not supported on spyre:0 ({_op_name(func)} would "
        f"create a {dtype_name(dtype)} tensor there); spyre-emu profile {profile.name!r} "
        f"supports: {profile.dtype_names}"
    )


def _missing_kernel(func: Any) -> UnsupportedOpError:
    name = func._schema.name
    return UnsupportedOpError(
        f"Could not run '{name}' with arguments from the 'spyre' backend. This could be "
        "because the operator doesn't exist for this backend, or was omitted during the "
        f"selective/custom build process (spyre-emu profile {_state.profile.name!r} does "
        f"not support '{_op_name(func)}')."
    )


def _mixed_devices(func: Any, other: Any) -> RuntimeError:
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"spyre:0 and {other.device}! (when checking arguments for {_op_name(func)})"
    )


def _wrap_tensor(t: Any, func: Any) -> Any:
    """A device tensor holding ``t``, the result of ``func``.

    Empty tensors of unsupported dtypes are let through: they hold no data,
    and PyTorch's own kernels allocate them on the input's device as
    placeholders (batch norm's uint8 reserve buffer).
    """
    dtype = t.dtype
    if dtype not in _state.dtypes and not _state.relaxed and t.numel() != 0:
        raise _unsupported_dtype(dtype, func)
    try:
        strides = t.stride()
    except RuntimeError:
        raise UnsupportedOpError(
            f"{_op_name(func)} produced a {t.layout} tensor; the spyre device holds strided "
            "tensors only"
        ) from None
    w = _make_wrapper(
        SpyreTensor,
        t.size(),
        strides=strides,
        storage_offset=t.storage_offset(),
        dtype=dtype,
        device=_state.device,
    )
    w._cpu = t
    return w


def _wrap(out: Any, func: Any) -> Any:
    kind = type(out)
    if kind is _Tensor:
        return _wrap_tensor(out, func)
    if kind is tuple or kind is list:
        return kind(_wrap_tensor(x, func) if type(x) is _Tensor else x for x in out)
    return out


def _plan(func: Any) -> Plan:
    """Decide once how ``func`` runs on the device; cache and return the closure."""
    schema = func._schema
    op = func._op
    name = schema.name
    allowed = _state.profile.allows_op(name, func._overloadname)
    mixed_ok = name in _MIXED_DEVICE_OK
    has_device = False
    generator: tuple[int, str, bool] | None = None
    writes: list[tuple[int, str, bool]] = []
    positional = 0
    for arg in schema.arguments:
        index = positional
        if not arg.kwarg_only:
            positional += 1
        kind = str(arg.type)
        if arg.name == "device" and kind in ("Optional[Device]", "Device"):
            has_device = True
        elif kind == "Optional[Generator]":
            generator = (index, arg.name, arg.kwarg_only)
        if arg.alias_info is not None and arg.alias_info.is_write:
            writes.append((index, arg.name, arg.kwarg_only))

    def unwrap_one(a: Any) -> Any:
        kind = type(a)
        if kind is SpyreTensor:
            return a._cpu
        if kind is list or kind is tuple:
            return kind(unwrap_one(x) for x in a)
        if isinstance(a, _Tensor) and not mixed_ok and (a.dim() != 0 or a.device != _CPU):
            raise _mixed_devices(func, a)
        return a

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not allowed and not _state.relaxed:
            raise _missing_kernel(func)
        wrap = True
        if has_device:
            dev = kwargs.get("device")
            if dev is not None:
                if dev.type == device_module.NAME:
                    kwargs = dict(kwargs)
                    kwargs["device"] = _CPU
                else:
                    wrap = False
        if generator is not None:
            args, kwargs = _with_generator(args, kwargs, generator)
        cpu_args = [a._cpu if type(a) is SpyreTensor else unwrap_one(a) for a in args]
        cpu_kwargs = {k: unwrap_one(v) for k, v in kwargs.items()} if kwargs else kwargs
        out = op(*cpu_args, **cpu_kwargs)
        if writes:
            return _after_write(func, out, args, kwargs, writes, wrap)
        if not wrap:
            return out
        if type(out) is _Tensor:
            return _wrap_tensor(out, func)
        return _wrap(out, func)

    _plans[func] = run
    return run


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], slot: tuple[int, str, bool]) -> Any:
    index, name, kwarg_only = slot
    if not kwarg_only and index < len(args):
        return args[index]
    return kwargs.get(name)


def _with_generator(
    args: tuple[Any, ...], kwargs: dict[str, Any], slot: tuple[int, str, bool]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Draw from the device's generator when the caller passed none."""
    if _arg(args, kwargs, slot) is not None:
        return args, kwargs
    index, name, kwarg_only = slot
    if not kwarg_only and index < len(args):
        patched = list(args)
        patched[index] = device_module.generator()
        return tuple(patched), kwargs
    return args, {**kwargs, name: device_module.generator()}


def _resync(w: Any, func: Any) -> None:
    """Give wrapper ``w`` the shape/strides its CPU tensor took (``resize_``, ``t_``, out=)."""
    inner = w._cpu
    if (
        w.shape == inner.shape
        and w.stride() == inner.stride()
        and w.storage_offset() == inner.storage_offset()
    ):
        return
    # Setting .data swaps the wrapper's metadata in place while keeping its
    # identity, autograd state and version counter: what resize_ does to a
    # real tensor. The new wrapper's storage is sized for the new extent.
    # (A Python exception in __torch_dispatch__ is fine here: resync runs in
    # the op, not under the autograd engine's guard.)
    w.data = _wrap_tensor(inner, func)


def _after_write(
    func: Any,
    out: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    writes: list[tuple[int, str, bool]],
    wrap: bool,
) -> Any:
    """Results of in-place and out= ops are their (mutated) arguments, not new tensors."""
    targets: list[Any] = []
    for slot in writes:
        value = _arg(args, kwargs, slot)
        if isinstance(value, (list, tuple)):
            targets.extend(v for v in value if isinstance(v, _Tensor))
        elif isinstance(value, _Tensor):
            targets.append(value)
    for target in targets:
        if type(target) is SpyreTensor:
            _resync(target, func)

    def back(x: Any) -> Any:
        if type(x) is not _Tensor:
            return x
        for target in targets:
            if target is x or (type(target) is SpyreTensor and target._cpu is x):
                return target
        return _wrap_tensor(x, func) if wrap else x

    kind = type(out)
    if kind is tuple or kind is list:
        return kind(back(x) for x in out)
    return back(out)


def factory_fallback(keyset: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """Ops that reach the PrivateUse1 key without a device tensor: factories.

    ``torch.empty(..., device="spyre")`` (and everything built on it: zeros,
    ones, full, arange, randn, ``.to("spyre")``) lands here. The first such
    allocation opens the device, taking its process lock.
    """
    dev = kwargs.get("device")
    if dev is None or dev.type != device_module.NAME:
        raise _missing_kernel(func)
    if dev.index not in (None, 0):
        device_module.set_device(dev)
    device_module.init()
    plan = _plans.get(func)
    if plan is None:
        plan = _plan(func)
    try:
        return plan(args, kwargs)
    except Exception as exc:
        if _current_autograd_node() is None:
            raise
        return _BackwardError(exc)


def copy_kernel(self: Any, src: Any, non_blocking: bool = False) -> Any:
    """``copy_`` when Python dispatch is off (``torch.tensor(data, device="spyre")``).

    PyTorch fills a new device tensor from host data with the Python key
    excluded, so the copy reaches the PrivateUse1 kernel directly. The boxed
    fallback cannot take tensor arguments in that state; a kernel can.
    """
    dst = self._cpu if type(self) is SpyreTensor else self
    source = src._cpu if type(src) is SpyreTensor else src
    dst.copy_(source, non_blocking)
    return self


def install(profile: SpyreProfile) -> None:
    """Make ``profile`` the device's limits (only before any op ran, see ``load``)."""
    _state.profile = profile
    _state.dtypes = frozenset(profile.dtypes)
    _state.device = torch.device(device_module.NAME, 0)
    _plans.clear()
