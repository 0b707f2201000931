# Owner(s): ["module: tests"]

import torch
from torch.testing import make_tensor
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import unary_ufuncs
from torch.testing._internal.common_utils import TestCase, run_tests

_unary_ops = [
    op
    for op in unary_ufuncs
    if op.name in ("abs", "neg", "exp", "sqrt", "sin", "tanh", "nn.functional.relu")
]


class TestUnaryUfuncs(TestCase):
    @ops(_unary_ops, allowed_dtypes=(torch.float16, torch.float32, torch.float64))
    def test_contig_vs_every_other(self, device, dtype, op):
        t = make_tensor((64,), device=device, dtype=dtype, low=0.5, high=4)
        self.assertEqual(op(t[::2]), op(t)[::2])

    @ops(_unary_ops, allowed_dtypes=(torch.float32,))
    def test_non_contig_expand(self, device, dtype, op):
        t = make_tensor((1, 5), device=device, dtype=dtype, low=0.5, high=4)
        expanded = t.expand(3, 5)
        self.assertEqual(op(expanded), op(expanded.contiguous()))

    @ops(_unary_ops, allowed_dtypes=(torch.float32, torch.float64))
    def test_out_arg_all_dtypes(self, device, dtype, op):
        if op.supports_out is False:
            self.skipTest(f"{op.name} has no out= variant")
        t = make_tensor((4, 4), device=device, dtype=dtype, low=0.5, high=4)
        out = torch.empty_like(t)
        op(t, out=out)
        self.assertEqual(out, op(t))


instantiate_device_type_tests(TestUnaryUfuncs, globals())

if __name__ == "__main__":
    run_tests()
