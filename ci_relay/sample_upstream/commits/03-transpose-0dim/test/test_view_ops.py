# Owner(s): ["module: viewing and reshaping"]

import torch
from torch.testing import make_tensor
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase, run_tests


def _is_view_of(base, other):
    root = base._base if base._is_view() else base
    return other._is_view() and other._base is root


class TestViewOps(TestCase):
    def test_view_shares_storage(self, device):
        t = torch.ones(4, 4, device=device)
        v = t.view(16)
        self.assertTrue(_is_view_of(t, v))
        v[0] = 5
        self.assertEqual(t[0, 0], 5)

    @dtypes(torch.float16, torch.float32, torch.int64)
    def test_transpose_strides(self, device, dtype):
        t = make_tensor((2, 3, 4), device=device, dtype=dtype)
        v = t.transpose(0, 2)
        self.assertTrue(_is_view_of(t, v))
        self.assertEqual(v.stride(), (1, 4, 12))
        self.assertEqual(v.shape, (4, 3, 2))

    def test_transpose_zero_dim(self, device):
        t = torch.tensor(3.0, device=device)
        self.assertEqual(t.transpose(0, -1), t)
        with self.assertRaises(IndexError):
            t.transpose(0, 1)

    def test_unsqueeze_view(self, device):
        t = torch.arange(6, device=device).view(2, 3)
        v = t.unsqueeze(1)
        self.assertTrue(_is_view_of(t, v))
        self.assertEqual(v.shape, (2, 1, 3))

    @dtypes(torch.float32, torch.bool)
    def test_expand_view(self, device, dtype):
        t = make_tensor((3, 1), device=device, dtype=dtype)
        v = t.expand(3, 4)
        self.assertTrue(_is_view_of(t, v))
        self.assertEqual(v.stride(), (1, 0))


class TestOldViewOps(TestCase):
    def test_ravel(self):
        t = torch.arange(12).view(3, 4)
        self.assertEqual(t.ravel(), torch.arange(12))
        self.assertFalse(t.T.ravel().data_ptr() == t.data_ptr() and t.T.is_contiguous())

    def test_flatten(self):
        t = torch.zeros(2, 3, 4)
        self.assertEqual(t.flatten(1).shape, (2, 12))
        self.assertEqual(t.flatten().shape, (24,))


instantiate_device_type_tests(TestViewOps, globals())

if __name__ == "__main__":
    run_tests()
