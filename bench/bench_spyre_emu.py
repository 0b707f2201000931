"""Cost of the emulated Spyre device over the CPU on device-generic tests.

Runs the same upstream-shaped test bodies (``def test_x(self, device,
dtype)``: elementwise ops, views, reductions, indexing, a small training step
with autograd, and OpInfo sample inputs checked against a CPU reference) once
with ``device="cpu"`` and once with ``device="spyre"`` in the same process,
alternating for several rounds. Prints the median of each and the ratio
(goal <= 3x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch.testing import make_tensor
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase

import spyre_emu

OPINFO_NAMES = ("add", "mul", "sub", "abs", "exp", "sum", "softmax", "matmul", "where", "neg")
OPINFOS = [op for op in op_db if op.name in OPINFO_NAMES and op.variant_test_name == ""]


class DeviceGenericTests(TestCase):  # type: ignore[misc]
    """Test bodies shaped like upstream ones; ``device`` and ``dtype`` come from the caller."""

    def runTest(self) -> None:  # unittest needs a method to bind the instance to
        pass

    def test_binary(self, device: str, dtype: Any) -> None:
        a = make_tensor((8, 16), device=device, dtype=dtype, low=-4, high=4)
        b = make_tensor((8, 16), device=device, dtype=dtype, low=1, high=4)
        self.assertEqual(torch.add(a, b), a + b)
        self.assertEqual(torch.mul(a, b, out=torch.empty_like(a)), a * b)
        self.assertEqual((a - b).cpu(), a.cpu() - b.cpu())

    def test_views(self, device: str, dtype: Any) -> None:
        t = make_tensor((4, 6), device=device, dtype=dtype)
        v = t.t()
        self.assertEqual(v.stride(), (1, 6))
        self.assertTrue(v._is_view())
        t.view(24)[0] = 3
        self.assertEqual(t[0, 0].item(), 3)
        self.assertEqual(t.unsqueeze(1).expand(4, 3, 6).shape, (4, 3, 6))

    def test_reductions(self, device: str, dtype: Any) -> None:
        t = make_tensor((16, 8), device=device, dtype=dtype, low=-2, high=2)
        ref = t.cpu().float()
        self.assertEqual(t.sum(0).float(), ref.sum(0), atol=1e-2, rtol=1e-2)
        self.assertEqual(t.amax(1).float(), ref.amax(1))
        self.assertEqual(t.argmax(1), ref.argmax(1))

    def test_indexing(self, device: str, dtype: Any) -> None:
        t = make_tensor((10, 4), device=device, dtype=dtype)
        idx = torch.tensor([0, 3, 7], device=device)
        self.assertEqual(t[idx], t.cpu()[idx.cpu()])
        mask = t > 0
        self.assertEqual(t[mask], t.cpu()[mask.cpu()])
        t[idx] = 0
        self.assertEqual(t[3].abs().sum().item(), 0)

    def test_training_step(self, device: str, dtype: Any) -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        ).to(device=device, dtype=dtype)
        x = make_tensor((4, 8), device=device, dtype=dtype)
        loss = model(x).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            self.assertEqual(p.grad.shape, p.shape)
            self.assertEqual(p.grad.device, p.device)

    def test_opinfo_samples(self, device: str, dtype: Any) -> None:
        for op in OPINFOS:
            if not op.supports_dtype(dtype, "cpu"):
                continue
            for sample in op.sample_inputs(device, dtype):
                cpu = sample.transform(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x)
                expected = op(cpu.input, *cpu.args, **cpu.kwargs)
                actual = op(sample.input, *sample.args, **sample.kwargs)
                self.assertEqual(actual, expected, exact_device=False)


TESTS: list[Callable[[DeviceGenericTests, str, Any], None]] = [
    DeviceGenericTests.test_binary,
    DeviceGenericTests.test_views,
    DeviceGenericTests.test_reductions,
    DeviceGenericTests.test_indexing,
    DeviceGenericTests.test_training_step,
    DeviceGenericTests.test_opinfo_samples,
]
DTYPES = (torch.float16, torch.float32)


def run_suite(case: DeviceGenericTests, device: str) -> float:
    start = time.perf_counter()
    for dtype in DTYPES:
        for test in TESTS:
            test(case, device, dtype)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault(spyre_emu.LOCK_DIR_ENV, tempfile.mkdtemp(prefix="bench-spyre-lock-"))
    spyre_emu.load()
    case = DeviceGenericTests()
    run_suite(case, "cpu")  # warm-up: imports, lazy inits, op plans
    run_suite(case, "spyre")
    cpu_times, spyre_times = [], []
    for _ in range(args.rounds):
        cpu_times.append(run_suite(case, "cpu"))
        spyre_times.append(run_suite(case, "spyre"))
    cpu, spyre = statistics.median(cpu_times), statistics.median(spyre_times)
    count = len(TESTS) * len(DTYPES)
    print(f"{count} device-generic test bodies (float16, float32), {args.rounds} rounds")
    print(f"cpu        median {cpu * 1000:8.1f} ms")
    print(f"spyre-emu  median {spyre * 1000:8.1f} ms")
    print(f"ratio spyre-emu / cpu: {spyre / cpu:.2f}x (goal <= 3x)")


if __name__ == "__main__":
    main()
