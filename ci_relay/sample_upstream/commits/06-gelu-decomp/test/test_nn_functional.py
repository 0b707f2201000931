# Owner(s): ["module: nn"]

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests


class TestNNFunctional(TestCase):
    def test_relu_inplace(self):
        x = torch.tensor([-1.0, 0.0, 2.0])
        y = F.relu(x, inplace=True)
        self.assertIs(y, x)
        self.assertEqual(x, torch.tensor([0.0, 0.0, 2.0]))

    def test_linear_shapes(self):
        x = torch.randn(5, 3)
        w = torch.randn(4, 3)
        b = torch.randn(4)
        self.assertEqual(F.linear(x, w, b).shape, (5, 4))
        self.assertEqual(F.linear(x, w, b), x @ w.T + b)

    def test_gelu_matches_erf_formula(self):
        x = torch.linspace(-4, 4, 101, dtype=torch.float64)
        expected = 0.5 * x * (1 + torch.erf(x / 2**0.5))
        self.assertEqual(F.gelu(x), expected)

    def test_gelu_tanh_approximation(self):
        x = torch.linspace(-4, 4, 101, dtype=torch.float64)
        exact = F.gelu(x)
        approx = F.gelu(x, approximate="tanh")
        self.assertEqual(approx, exact, atol=1e-3, rtol=0)
        with self.assertRaises(RuntimeError):
            F.gelu(x, approximate="fast")

    def test_linear_backward(self):
        x = torch.randn(2, 3, requires_grad=True)
        w = torch.randn(4, 3, requires_grad=True)
        F.linear(x, w).sum().backward()
        self.assertEqual(x.grad, w.sum(0).expand(2, 3))


if __name__ == "__main__":
    run_tests()
