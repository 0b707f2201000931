"""Decompositions of composite operators into simpler ones (stand-in sources)."""

import math

decomposition_table = {}


def register_decomposition(name):
    def wrap(fn):
        decomposition_table[name] = fn
        return fn

    return wrap


@register_decomposition("aten.gelu")
def gelu(a, approximate="none"):
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        return 0.5 * a * (1 + (k * (a + 0.044715 * a * a * a)).tanh())
    return 0.5 * a * (1 + (a * (1 / math.sqrt(2))).erf())


@register_decomposition("aten.addcmul")
def addcmul(self, tensor1, tensor2, value=1):
    return self + value * tensor1 * tensor2
