"""Functional neural-network operations (stand-in sources)."""

import math


def relu(input, inplace=False):
    if inplace:
        return input.clamp_(min=0)
    return input.clamp(min=0)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (input + 0.044715 * input.pow(3))
        return 0.5 * input * (1 + inner.tanh())
    return 0.5 * input * (1 + (input / math.sqrt(2)).erf())


def linear(input, weight, bias=None):
    out = input.matmul(weight.t())
    return out if bias is None else out + bias
