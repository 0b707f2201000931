# Owner(s): ["module: tests"]

import torch
from torch.testing import make_tensor
from torch.testing._internal.common_device_type import (
    dtypes,
    instantiate_device_type_tests,
    ops,
)
from torch.testing._internal.common_methods_invocations import binary_ufuncs
from torch.testing._internal.common_utils import TestCase, run_tests

# A small, fast slice of the binary ufunc OpInfos.
_binary_ops = [op for op in binary_ufuncs if op.name in ("add", "sub", "mul", "div", "maximum")]


class TestBinaryUfuncs(TestCase):
    @dtypes(torch.float16, torch.float32, torch.float64, torch.int64)
    def test_add(self, device, dtype):
        a = make_tensor((4, 5), device=device, dtype=dtype, low=-8, high=8)
        b = make_tensor((4, 5), device=device, dtype=dtype, low=-8, high=8)
        self.assertEqual(torch.add(a, b), a + b)
        self.assertEqual(torch.add(a, b, alpha=2), a + 2 * b)

    @dtypes(torch.float32, torch.float64)
    def test_mul_scalar(self, device, dtype):
        a = make_tensor((3, 3), device=device, dtype=dtype)
        self.assertEqual(a * 2.5, torch.mul(a, torch.tensor(2.5, dtype=dtype, device=device)))

    def test_type_promotion(self, device):
        a = torch.ones(3, dtype=torch.int32, device=device)
        b = torch.ones(3, dtype=torch.float32, device=device)
        self.assertEqual((a + b).dtype, torch.float32)
        self.assertEqual((a * 2).dtype, torch.int32)

    @dtypes(torch.float32, torch.float64)
    def test_div_rounding_modes(self, device, dtype):
        a = torch.tensor([-7.5, -2.0, 3.0, 7.5], device=device, dtype=dtype)
        b = torch.tensor([2.0, 2.0, 2.0, -2.0], device=device, dtype=dtype)
        self.assertEqual(torch.div(a, b, rounding_mode="trunc"), torch.trunc(a / b))
        self.assertEqual(torch.div(a, b, rounding_mode="floor"), torch.floor(a / b))

    @ops(_binary_ops, allowed_dtypes=(torch.float16, torch.float32, torch.float64))
    def test_contig_vs_transposed(self, device, dtype, op):
        lhs = make_tensor((6, 4), device=device, dtype=dtype, low=1, high=4)
        rhs = make_tensor((6, 4), device=device, dtype=dtype, low=1, high=4)
        expected = op(lhs, rhs).T
        self.assertEqual(op(lhs.T.contiguous(), rhs.T.contiguous()), expected)
        self.assertEqual(op(lhs.T, rhs.T), expected)

    @ops([op for op in _binary_ops if op.name != "maximum"], allowed_dtypes=(torch.float32,))
    def test_scalar_support(self, device, dtype, op):
        lhs = make_tensor((5,), device=device, dtype=dtype, low=1, high=4)
        scalar = 3.0
        expected = op(lhs, torch.full_like(lhs, scalar))
        self.assertEqual(op(lhs, scalar), expected)


instantiate_device_type_tests(TestBinaryUfuncs, globals())

if __name__ == "__main__":
    run_tests()
