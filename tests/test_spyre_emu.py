"""The emulated Spyre device: real torch, real processes.

Behaviour of device tensors is tested in this process (the emulator is loaded
once per process, with the default profile). What needs a fresh process runs
in one: a second process opening the device, another PrivateUse1 backend,
another profile, errors during backward (a regression there would abort the
process), and upstream-shaped test files run through ``TORCH_TEST_DEVICES``.
"""

from __future__ import annotations

import copy
import io
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import spyre_emu
from spyre_emu.profile import ESSENTIAL_OPS

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def spyre(tmp_path_factory: pytest.TempPathFactory) -> Iterator[spyre_emu.SpyreProfile]:
    """The emulator, loaded in this process; its lock lives in a private folder."""
    saved = os.environ.get(spyre_emu.LOCK_DIR_ENV)
    os.environ[spyre_emu.LOCK_DIR_ENV] = str(tmp_path_factory.mktemp("spyre-lock"))
    try:
        profile = spyre_emu.load(spyre_emu.DEFAULT_PROFILE)
        torch.spyre.init()  # take the lock while the private folder is set
        yield profile
    finally:
        if saved is None:
            os.environ.pop(spyre_emu.LOCK_DIR_ENV, None)
        else:
            os.environ[spyre_emu.LOCK_DIR_ENV] = saved


@pytest.fixture
def run_python(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run Python code in a fresh process with its own lock folder."""

    def run(
        code: str, *, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        full_env = _child_env(tmp_path / "locks")
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


def _child_env(lock_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCH_TEST_DEVICES", "PYTORCH_TESTING_DEVICE_ONLY_FOR", "SPYRE_EMU_PROFILE")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env[spyre_emu.LOCK_DIR_ENV] = str(lock_dir)
    return env


# --- device identity, data movement, views, in-place ops, autograd -------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(2, 3, device="spyre"),
        lambda: torch.zeros(2, 3, device="spyre"),
        lambda: torch.ones(2, 3, device="spyre"),
        lambda: torch.randn(2, 3, device="spyre"),
        lambda: torch.arange(6, device="spyre"),
        lambda: torch.full((2, 3), 1.5, device="spyre", dtype=torch.float16),
        lambda: torch.tensor([1.0, 2.0], device="spyre"),
        lambda: torch.zeros(2, device="spyre:0"),
    ],
    ids=["empty", "zeros", "ones", "randn", "arange", "full", "tensor", "spyre:0"],
)
def test_factories_create_tensors_on_spyre(spyre: Any, make: Callable[[], torch.Tensor]) -> None:
    t = make()
    assert t.device == torch.device("spyre", 0)
    assert str(t.device) == "spyre:0"
    assert t.is_spyre
    assert isinstance(t, spyre_emu.SpyreTensor)


def test_factory_values_match_cpu(spyre: Any) -> None:
    assert torch.equal(torch.arange(2, 11, 3, device="spyre").cpu(), torch.arange(2, 11, 3))
    assert torch.equal(torch.full((2,), 7, device="spyre").cpu(), torch.full((2,), 7))
    assert torch.zeros(3, device="spyre").cpu().tolist() == [0.0, 0.0, 0.0]
    assert torch.ones(2, 2, device="spyre").sum().item() == 4


def test_moving_to_the_device_copies_and_cpu_comes_back(spyre: Any) -> None:
    source = torch.arange(6.0).view(2, 3)
    on_device = source.to("spyre")
    assert on_device.device.type == "spyre"
    on_device.add_(100)
    assert source.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    back = on_device.cpu()
    assert type(back) is torch.Tensor and back.device.type == "cpu"
    assert back.tolist() == [[100.0, 101.0, 102.0], [103.0, 104.0, 105.0]]
    back.zero_()
    assert on_device.to("cpu").sum().item() == 615
    assert torch.ones(2).spyre().device.type == "spyre"


def test_device_and_cpu_tensors_cannot_mix(spyre: Any) -> None:
    with pytest.raises(RuntimeError, match=r"same device.*spyre:0 and cpu"):
        torch.ones(3, device="spyre") + torch.ones(3)
    # a 0-dim CPU tensor is a scalar, as on any accelerator
    assert (torch.ones(3, device="spyre") + torch.tensor(2.0)).cpu().tolist() == [3.0] * 3


def test_views_have_true_strides_and_share_data(spyre: Any) -> None:
    base = torch.zeros(4, 6, device="spyre")
    t = base.t()
    assert t.stride() == (1, 6) and t.shape == (6, 4)
    assert t._is_view() and t._base is base
    row = base[1]
    assert row.storage_offset() == 6 and row.data_ptr() == base.data_ptr() + 6 * 4
    base.view(24)[7] = 5
    assert base[1, 1].item() == 5 and row[1].item() == 5
    t[2, 3] = 9  # writes base[3, 2]
    assert base[3, 2].item() == 9
    assert base.unsqueeze(0).expand(2, 4, 6).stride() == (0, 6, 1)


def test_in_place_and_out_ops_keep_identity_and_resize(spyre: Any) -> None:
    a = torch.ones(2, 3, device="spyre")
    b = a.mul_(3)
    assert b is a and a.sum().item() == 18
    out = torch.empty(0, device="spyre")
    result = torch.add(a, a, out=out)
    assert result is out and out.shape == (2, 3) and out.stride() == (3, 1)
    assert out.cpu().tolist() == [[6.0] * 3] * 2
    grown = torch.zeros(2, device="spyre")
    grown.resize_(3, 4)
    assert grown.shape == (3, 4) and grown.stride() == (4, 1)
    u = torch.arange(6, device="spyre").view(2, 3)
    u.t_()
    assert u.shape == (3, 2) and u.stride() == (1, 3)


def test_autograd_grads_live_on_the_device_and_match_cpu(spyre: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference = copy.deepcopy(model)
    model.to("spyre")
    x = torch.randn(5, 4)
    model(x.to("spyre")).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    for p, ref in zip(model.parameters(), reference.parameters(), strict=True):
        assert p.device.type == "spyre" and p.grad is not None and p.grad.device.type == "spyre"
        torch.testing.assert_close(p.grad.cpu(), ref.grad)
    # gradients flow back across .to("spyre") to a CPU leaf
    leaf = torch.randn(3, requires_grad=True)
    (leaf.to("spyre") * 2).sum().backward()
    assert leaf.grad is not None and leaf.grad.tolist() == [2.0] * 3


def test_module_conversions_move_the_host_data(spyre: Any) -> None:
    conv = torch.nn.Conv2d(3, 4, 3).to("spyre").half()  # Module._apply sets param.data
    assert conv.weight.dtype == torch.float16 and conv.weight.device.type == "spyre"
    out = conv(torch.randn(1, 3, 8, 8, device="spyre", dtype=torch.float16))
    assert out.shape == (1, 4, 6, 6) and out.dtype == torch.float16
    p = torch.ones(3, device="spyre", requires_grad=True)
    p.data = torch.zeros(2, device="spyre")
    assert p.shape == (2,) and p.cpu().tolist() == [0.0, 0.0] and p.requires_grad
    with pytest.raises(
        RuntimeError, match=r"cannot set \.data of a spyre tensor to a tensor on cpu"
    ):
        p.data = torch.ones(2)


def test_printing(spyre: Any) -> None:
    t = torch.tensor([[1.5, 2.0], [3.0, 4.0]], device="spyre", dtype=torch.float16)
    text = repr(t)
    assert text.startswith("tensor([[1.5000, 2.0000],\n        [3.0000, 4.0000]]")
    assert "device='spyre:0'" in text and "dtype=torch.float16" in text
    assert "grad_fn=<MulBackward0>" in str(torch.ones(2, device="spyre", requires_grad=True) * 2)
    assert f"{torch.tensor(2.25, device='spyre'):.1f}" == "2.2"


def test_copy_pickle_and_numpy_behave_like_a_device(spyre: Any) -> None:
    t = torch.arange(6, device="spyre").view(2, 3).t()
    clone = copy.deepcopy(t)
    assert clone.device.type == "spyre" and torch.equal(clone.cpu(), t.cpu())
    buffer = io.BytesIO()
    torch.save({"t": t}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)["t"]
    assert loaded.device.type == "spyre" and loaded.stride() == (1, 3)
    assert torch.equal(loaded.cpu(), t.cpu())
    with pytest.raises(TypeError, match=r"can't convert spyre:0 device type tensor to numpy"):
        t.numpy()


def test_device_module(spyre: Any) -> None:
    assert torch.spyre.is_available() and torch.spyre.is_initialized()
    assert torch.spyre.device_count() == 1 and torch.spyre.current_device() == 0
    torch.spyre.synchronize()
    with pytest.raises(RuntimeError, match="Invalid device index 1"):
        torch.zeros(1, device="spyre:1")
    torch.manual_seed(7)
    first = torch.randn(4, device="spyre")
    torch.manual_seed(7)
    assert torch.equal(torch.randn(4, device="spyre").cpu(), first.cpu())
    state = torch.spyre.get_rng_state()
    drawn = torch.rand(3, device="spyre")
    torch.spyre.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="spyre").cpu(), drawn.cpu())
    # the device has its own generator: CPU draws do not shift it
    torch.spyre.manual_seed(1)
    a = torch.rand(2, device="spyre")
    torch.spyre.manual_seed(1)
    torch.rand(5)
    assert torch.equal(torch.rand(2, device="spyre").cpu(), a.cpu())


# --- bad input: dtypes, ops, loading twice ------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(2, dtype=torch.float64).to("spyre"),
        lambda: torch.zeros(2, dtype=torch.float64, device="spyre"),
        lambda: torch.ones(2, device="spyre").double(),
        lambda: torch.tensor([1, 2], dtype=torch.int32, device="spyre"),
    ],
    ids=["to", "factory", "cast-on-device", "tensor"],
)
def test_unsupported_dtype_on_the_device_raises(
    spyre: Any, make: Callable[[], torch.Tensor]
) -> None:
    with pytest.raises(spyre_emu.UnsupportedDtypeError) as info:
        make()
    assert isinstance(info.value, TypeError) and isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert re.search(r"dtype (float64|int32) is not supported on spyre:0", message)
    assert "supports: float16, bfloat16, float32, int64, bool" in message


def test_op_outside_the_profile_raises_like_a_missing_kernel(spyre: Any) -> None:
    with pytest.raises(NotImplementedError) as info:
        torch.linalg.cholesky(torch.eye(2, device="spyre"))
    assert isinstance(info.value, spyre_emu.UnsupportedOpError)
    assert str(info.value).startswith(
        "Could not run 'aten::linalg_cholesky_ex' with arguments from the 'spyre' backend."
    )
    assert torch.linalg.cholesky(torch.eye(2)).shape == (2, 2)  # the CPU is unaffected


def test_loading_twice_is_idempotent_for_the_same_profile(spyre: Any) -> None:
    assert spyre_emu.load() is spyre
    assert spyre_emu.load(spyre_emu.SpyreProfile()) is spyre
    assert spyre_emu.SpyreProfile() == spyre_emu.DEFAULT_PROFILE
    assert spyre_emu.loaded_profile() is spyre


def test_loading_again_with_another_profile_raises(spyre: Any) -> None:
    other = spyre_emu.SpyreProfile(name="fp16-only", dtypes=("float16",))
    with pytest.raises(
        spyre_emu.LoadError, match=r"already loaded .* profile 'torch-spyre-published'.*'fp16-only'"
    ):
        spyre_emu.load(other)
    assert spyre_emu.loaded_profile() is spyre


def test_loading_after_privateuse1_was_renamed_raises(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    proc = run_python(
        """
        import torch, spyre_emu
        torch.utils.rename_privateuse1_backend("foo")
        try:
            spyre_emu.load()
        except spyre_emu.LoadError as exc:
            print("LoadError:", exc)
        else:
            print("loaded")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "LoadError: PrivateUse1 is already registered as 'foo'" in proc.stdout


# --- profiles -----------------------------------------------------------------------------


def test_profile_yaml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "card.yaml"
    path.write_text(
        "name: small-card\ndtypes: [float16, bool]\nsupported_ops: [add, 'mul.Tensor', 'aten::sum*']\n"
    )
    profile = spyre_emu.load_profile_file(path)
    assert profile.name == "small-card"
    assert profile.dtypes == (torch.float16, torch.bool)
    assert profile.allows_op("aten::add", "Tensor") and profile.allows_op("aten::add", "out")
    assert profile.allows_op("aten::mul", "Tensor") and not profile.allows_op("aten::mul", "Scalar")
    assert profile.allows_op("aten::sum", "dim_IntList")
    assert not profile.allows_op("aten::sub", "Tensor")
    assert profile.allows_op("aten::empty", "memory_format")  # plumbing is always allowed
    assert profile.unsupported_ops == spyre_emu.DEFAULT_PROFILE.unsupported_ops
    assert "empty.memory_format" in ESSENTIAL_OPS


def test_default_profile_denies_op_families() -> None:
    profile = spyre_emu.DEFAULT_PROFILE
    assert profile.dtypes[0] == torch.float16
    assert not profile.allows_op("aten::_fft_r2c", "default")
    assert not profile.allows_op("aten::linalg_qr", "default")
    assert profile.allows_op("aten::matmul", "default")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("dtypes: [float16]\nbogus: 1\n", r"unknown key\(s\) \['bogus'\]"),
        ("dtypes: [float16, notadtype]\n", r"'notadtype' is not a torch dtype"),
        ("dtypes: []\n", r"dtypes is empty"),
        ("dtypes: [float16, float16]\n", r"lists a dtype twice"),
        ("supported_ops: add\n", r"expected a list of op names"),
        ("[1, 2]\n", r"a profile is a mapping"),
        ("dtypes: [float16\n", r"not valid YAML"),
    ],
)
def test_bad_profile_files_are_rejected(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(spyre_emu.ProfileError, match=error) as info:
        spyre_emu.load_profile_file(path)
    assert str(path) in str(info.value)


def test_profile_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(spyre_emu.PROFILE_ENV, raising=False)
    assert spyre_emu.profile_from_env() is spyre_emu.DEFAULT_PROFILE
    path = tmp_path / "p.yaml"
    path.write_text("dtypes: [float16]\n")
    monkeypatch.setenv(spyre_emu.PROFILE_ENV, str(path))
    assert spyre_emu.profile_from_env().dtypes == (torch.float16,)
    monkeypatch.setenv(spyre_emu.PROFILE_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(spyre_emu.ProfileError, match="cannot read the profile"):
        spyre_emu.profile_from_env()


def test_profile_from_env_limits_ops_and_dtypes_and_backward_errors_do_not_abort(
    tmp_path: Path, run_python: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    profile = tmp_path / "nomul.yaml"
    profile.write_text("name: no-mul\ndtypes: [float16, float32, bool]\nunsupported_ops: [mul]\n")
    proc = run_python(
        """
        import torch, spyre_emu
        print("profile", spyre_emu.load().name)
        x = torch.randn(3, device="spyre", requires_grad=True)
        for label, call in [
            ("mul", lambda: x * x),
            ("int64", lambda: torch.arange(3, device="spyre")),
            ("backward", lambda: torch.exp(x).sum().backward()),
        ]:
            try:
                call()
            except Exception as exc:
                print(label, type(exc).__name__, exc)
        print("alive", torch.exp(x).sum().item() > 0)
        """,
        env={"SPYRE_EMU_PROFILE": str(profile)},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "profile no-mul"
    assert lines[1].startswith(
        "mul UnsupportedOpError Could not run 'aten::mul' with arguments from the 'spyre' backend."
    )
    assert lines[2].startswith("int64 UnsupportedDtypeError dtype int64 is not supported")
    assert "profile 'no-mul' supports: float16, float32, bool" in lines[2]
    # exp's backward multiplies: the error surfaces as a RuntimeError carrying the
    # original one instead of aborting the process
    assert lines[3].startswith("backward RuntimeError")
    assert "UnsupportedOpError: Could not run 'aten::mul'" in lines[3]
    assert lines[4] == "alive True"


# --- one process per device ---------------------------------------------------------------

HOLDER = """
import sys, torch, spyre_emu
spyre_emu.load()
torch.ones(1, device="spyre")
print("holding", flush=True)
sys.stdin.readline()
"""

OPENER = """
import os, torch, spyre_emu
spyre_emu.load()
torch.zeros(1, device="spyre")
print("opened by", os.getpid())
"""


def test_second_process_opening_the_device_gets_a_clear_error(tmp_path: Path) -> None:
    env = _child_env(tmp_path / "locks")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        second = subprocess.run(
            [sys.executable, "-c", OPENER], env=env, capture_output=True, text=True, timeout=120
        )
        assert second.returncode != 0
        assert "spyre_emu.errors.DeviceBusyError: spyre:0 is in use by pid " in second.stderr
        assert f"pid {holder.pid} (lock file {tmp_path / 'locks' / 'spyre0.lock'})" in second.stderr
    finally:
        holder.kill()  # SIGKILL: the kernel still releases the flock
        holder.communicate(timeout=60)
    assert holder.returncode == -signal.SIGKILL
    third = subprocess.run(
        [sys.executable, "-c", OPENER], env=env, capture_output=True, text=True, timeout=120
    )
    assert third.returncode == 0, third.stderr
    assert third.stdout.startswith("opened by")


def test_importing_and_loading_do_not_open_the_device(
    run_python: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    proc = run_python(
        """
        import torch, spyre_emu
        spyre_emu.load()
        print(torch.spyre.is_initialized())
        torch.ones(1, device="spyre")
        print(torch.spyre.is_initialized())
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]
    assert (tmp_path / "locks" / "spyre0.lock").exists()


# --- upstream tests through TORCH_TEST_DEVICES --------------------------------------------

UPSTREAM_TEST = """
import torch
from torch.testing import make_tensor
from torch.testing._internal.common_device_type import (
    dtypes, dtypesIfPRIVATEUSE1, instantiate_device_type_tests, onlyCPU, onlyOn, ops,
    onlyNativeDeviceTypes, skipPRIVATEUSE1If,
)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests

_ops = [op for op in op_db if op.name in ("abs", "mul") and op.variant_test_name == ""]


class TestShapes(TestCase):
    def test_device(self, device):
        t = torch.ones(2, 3, device=device)
        self.assertEqual(t.device.type, "spyre")
        self.assertEqual((t * 2).sum().item(), 12)

    @dtypes(torch.float32, torch.float64)
    @dtypesIfPRIVATEUSE1(torch.float16, torch.float32)
    def test_dtypes(self, device, dtype):
        self.assertEqual(make_tensor((3,), device=device, dtype=dtype).dtype, dtype)

    @dtypes(torch.float32, torch.float64)
    def test_generic_dtypes(self, device, dtype):
        self.assertEqual(torch.zeros(2, device=device, dtype=dtype).sum().item(), 0)

    @onlyCPU
    def test_only_cpu(self, device):
        pass

    @onlyOn("spyre")
    def test_only_spyre(self, device):
        self.assertEqual(self.device_type, "spyre")

    @onlyNativeDeviceTypes
    def test_native(self, device):
        pass

    @skipPRIVATEUSE1If(True, "not on this backend")
    def test_skipped_here(self, device):
        pass

    @ops(_ops, allowed_dtypes=(torch.float16, torch.float32, torch.float64))
    def test_samples(self, device, dtype, op):
        for sample in op.sample_inputs(device, dtype):
            cpu = sample.transform(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x)
            self.assertEqual(op(sample.input, *sample.args, **sample.kwargs),
                             op(cpu.input, *cpu.args, **cpu.kwargs), exact_device=False)


instantiate_device_type_tests(TestShapes, globals())

if __name__ == "__main__":
    run_tests()
"""

PASSED = {
    "TestShapesSPYRE::test_device_spyre",
    "TestShapesSPYRE::test_dtypes_spyre_float16",
    "TestShapesSPYRE::test_dtypes_spyre_float32",
    "TestShapesSPYRE::test_generic_dtypes_spyre_float32",
    "TestShapesSPYRE::test_only_spyre_spyre",
    "TestShapesSPYRE::test_native_spyre",
    "TestShapesSPYRE::test_samples_abs_spyre_float16",
    "TestShapesSPYRE::test_samples_abs_spyre_float32",
    "TestShapesSPYRE::test_samples_mul_spyre_float16",
    "TestShapesSPYRE::test_samples_mul_spyre_float32",
}
SKIPPED = {"TestShapesSPYRE::test_only_cpu_spyre", "TestShapesSPYRE::test_skipped_here_spyre"}
# OpInfo has no Spyre dtype list, so PyTorch instantiates the CPU dtypes; the
# profile refuses float64 with a clear error.
FAILED = {
    "TestShapesSPYRE::test_generic_dtypes_spyre_float64",
    "TestShapesSPYRE::test_samples_abs_spyre_float64",
    "TestShapesSPYRE::test_samples_mul_spyre_float64",
}


def _outcomes(junit: Path) -> dict[str, set[str]]:
    import xml.etree.ElementTree as ET

    found: dict[str, set[str]] = {"passed": set(), "skipped": set(), "failed": set()}
    for case in ET.parse(junit).iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        tags = {child.tag for child in case}
        kind = (
            "failed"
            if tags & {"failure", "error"}
            else "skipped"
            if "skipped" in tags
            else "passed"
        )
        found[kind].add(name)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("preloaded", [False, True], ids=["plain", "emulator-loaded-first"])
def test_upstream_tests_instantiate_for_spyre(tmp_path: Path, preloaded: bool) -> None:
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    (upstream / "test_shapes.py").write_text(UPSTREAM_TEST)
    if preloaded:  # e.g. a conftest of the backend imports it before torch's test framework
        (upstream / "conftest.py").write_text("import spyre_emu\nspyre_emu.load()\n")
    env = _child_env(tmp_path / "locks")
    env.update(spyre_emu.upstream_test_env())
    junit = tmp_path / "junit.xml"
    junit_args = ["--junitxml", str(junit), "-o", "junit_family=xunit2"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "test_shapes.py", "-p", "no:cacheprovider", *junit_args],
        cwd=upstream,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the float64 variants fail
    outcomes = _outcomes(junit)
    assert outcomes == {"passed": PASSED, "skipped": SKIPPED, "failed": FAILED}, proc.stdout
    assert "UnsupportedDtypeError: dtype float64 is not supported on spyre:0" in proc.stdout


def test_upstream_test_env_points_at_the_device_base_file() -> None:
    env = spyre_emu.upstream_test_env()
    assert env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] == "privateuse1"
    path = Path(env["TORCH_TEST_DEVICES"])
    assert path == REPO_ROOT / "spyre_emu" / "device_test_base.py" and path.is_file()


def test_each_test_worker_has_its_own_emulated_card(request: pytest.FixtureRequest) -> None:
    """tests/conftest.py gives each xdist worker its own lock folder; inheriting the
    controller's would make upstream runs on two workers meet on one card (DeviceBusyError)."""
    given = getattr(request.config, "workerinput", {})
    folder = os.environ[spyre_emu.LOCK_DIR_ENV]
    if "-pytest-" in folder:  # not a folder the person running the suite chose
        assert folder.endswith(f"-{given.get('workerid', 'main')}")
        if given:  # and another suite on the same machine has other folders
            assert f"-pytest-{given['testrunuid'][:12]}-" in folder
