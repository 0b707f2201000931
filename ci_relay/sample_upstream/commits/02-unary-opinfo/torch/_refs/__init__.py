"""Python references for elementwise and view operations (stand-in sources)."""

import math


def _broadcast_shapes(a_shape, b_shape):
    ndim = max(len(a_shape), len(b_shape))
    a = (1,) * (ndim - len(a_shape)) + tuple(a_shape)
    b = (1,) * (ndim - len(b_shape)) + tuple(b_shape)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise RuntimeError(f"shapes {a_shape} and {b_shape} are not broadcastable")
        out.append(max(x, y))
    return tuple(out)


def add(a, b, *, alpha=1):
    """a + alpha * b, elementwise with broadcasting."""
    if alpha != 1:
        b = mul(b, alpha)
    return a.__class__._elementwise("add", a, b)


def sub(a, b, *, alpha=1):
    if alpha != 1:
        b = mul(b, alpha)
    return a.__class__._elementwise("sub", a, b)


def mul(a, b):
    return a.__class__._elementwise("mul", a, b)


def div(a, b, *, rounding_mode=None):
    if rounding_mode not in (None, "trunc", "floor"):
        raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found {rounding_mode!r}")
    out = a.__class__._elementwise("div", a, b)
    if rounding_mode == "trunc":
        return out.__class__._elementwise("trunc", out)
    if rounding_mode == "floor":
        return out.__class__._elementwise("floor", out)
    return out


def transpose(a, dim0, dim1):
    ndim = len(a.shape)
    dim0 = dim0 % ndim
    dim1 = dim1 % ndim
    perm = list(range(ndim))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return a.as_strided([a.shape[p] for p in perm], [a.stride()[p] for p in perm])


def unsqueeze(a, dim):
    ndim = len(a.shape) + 1
    dim = dim % ndim
    shape = list(a.shape)
    strides = list(a.stride())
    stride = strides[dim] * shape[dim] if dim < len(shape) else 1
    shape.insert(dim, 1)
    strides.insert(dim, stride)
    return a.as_strided(shape, strides)


def numel(shape):
    return math.prod(shape)


def _unary(name, a):
    return a.__class__._elementwise(name, a)


def abs(a):
    return _unary("abs", a)


def neg(a):
    return _unary("neg", a)


def exp(a):
    return _unary("exp", a)


def sqrt(a):
    return _unary("sqrt", a)
