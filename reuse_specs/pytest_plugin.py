"""pytest plugin that applies reuse specs to upstream PyTorch test files.

Load it with ``-p reuse_specs.pytest_plugin --reuse-spec FILE``; without
``--reuse-spec`` it does nothing. Upstream files are never edited: modes
become pytest marks at collection time and the few runtime edits (precision,
``no_grad``, ``cpu_move``) are applied to the test-case instance around the
call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from reuse_specs.backends import Backend, UnknownBackend, add_backends_dir, get_backend
from reuse_specs.dtypes import dtype_name_of
from reuse_specs.errors import SpecErrors
from reuse_specs.loader import LoadedSpec, load_specs
from reuse_specs.matching import Decision, TestVariant, decide
from reuse_specs.modes import Mode
from reuse_specs.op_includes import register as register_includes
from reuse_specs.schema import Precision

DECISION_KEY = pytest.StashKey[Decision]()
VARIANT_KEY = pytest.StashKey[TestVariant]()
PLUGIN_NAME = "reuse-spec-session"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("reuse-spec", "apply reuse specs (torch-spyre test suite configs)")
    group.addoption(
        "--reuse-spec",
        action="append",
        default=[],
        metavar="FILE",
        help="spec file to apply; repeat to merge several",
    )
    group.addoption("--reuse-backend", default="cpu", metavar="NAME", help="backend profile")
    group.addoption(
        "--reuse-backends-dir",
        default=None,
        metavar="DIR",
        help="a folder of backend declarations beside the bundled ones",
    )
    group.addoption(
        "--reuse-upstream",
        default=None,
        metavar="DIR",
        help="upstream PyTorch checkout (sets ${TORCH_ROOT}); default: $TORCH_ROOT",
    )
    group.addoption(
        "--reuse-tests",
        default=None,
        metavar="FILE",
        help="run only these generic tests (one FILE::Class::test per line, from a TestPlan)",
    )
    group.addoption(
        "--reuse-deselect",
        default=None,
        metavar="FILE",
        help="leave out these pytest node ids (one per line; a shard runner's resume list)",
    )
    group.addoption(
        "--reuse-label",
        default=None,
        metavar="LABEL",
        help="run only tests whose labels include LABEL (others are skipped)",
    )


def pytest_configure(config: pytest.Config) -> None:
    spec_paths = config.getoption("reuse_spec")
    if not spec_paths:
        return
    upstream_opt = config.getoption("reuse_upstream")
    if config.getoption("reuse_backends_dir"):
        add_backends_dir(Path(config.getoption("reuse_backends_dir")))
    try:
        backend = get_backend(config.getoption("reuse_backend"))
        spec = load_specs(
            [Path(p) for p in spec_paths],
            Path(upstream_opt) if upstream_opt else None,
            backend.name,
        )
    except (SpecErrors, UnknownBackend) as exc:
        raise pytest.UsageError(str(exc)) from None
    # PyTorch's device-generic framework reads these when test modules import it.
    backend.apply_env(os.environ)
    register_includes(spec)  # before the test modules import: their @ops lists grow
    tags = {tag for f in spec.files for r in f.rules for tag in r.entry.tags}
    tags |= {
        tag
        for f in spec.files
        for r in f.rules
        for include in r.entry.edits.ops.include
        for tag in include.tags
    }
    for tag in sorted(tags):
        config.addinivalue_line("markers", f"{tag}: reuse-spec tag")
    only: set[str] | None = None
    tests_file = config.getoption("reuse_tests")
    if tests_file:
        try:
            lines = Path(tests_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise pytest.UsageError(f"--reuse-tests {tests_file}: {exc.strerror}") from None
        only = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    deselect: set[str] = set()
    deselect_file = config.getoption("reuse_deselect")
    if deselect_file:
        try:
            deselect = set(Path(deselect_file).read_text(encoding="utf-8").split())
        except OSError as exc:
            raise pytest.UsageError(f"--reuse-deselect {deselect_file}: {exc.strerror}") from None
    config.pluginmanager.register(
        ReuseSpecSession(spec, backend, config.getoption("reuse_label"), only, deselect),
        PLUGIN_NAME,
    )


def _is_device_class(cls: type) -> bool:
    return any(base.__name__ == "DeviceTypeTestBase" for base in cls.__mro__)


HARDWARE_GENERIC = "hardware-generic: no device parameter"
CPU_NOTE = "ran on the CPU: a hardware-generic test (no device parameter), listed in a spec"
NOTE_PROPERTY = "reuse_spec.note"


def hardware_generic(item: pytest.Item) -> bool:
    """A test that never gets a device: a plain ``TestCase`` class (or a function), not one
    PyTorch instantiated per device. A class's ``hw_classification`` decides when it has
    one (PyTorch tags hardware-generic classes ``GENERIC``)."""
    cls = getattr(item, "cls", None)
    if cls is None:
        return True
    tagged = getattr(cls, "hw_classification", None)
    if tagged is not None:
        return "generic" in str(getattr(tagged, "name", tagged)).lower()
    return not _is_device_class(cls)


def _module_name(module_info: Any) -> str | None:
    name = getattr(module_info, "name", None)
    return f"torch.{name}" if isinstance(name, str) and name.startswith("nn.") else name


@functools.lru_cache(maxsize=4096)
def _resolved(path: str) -> Path:
    """One resolve per file, not per test (a file can hold 25,000 variants)."""
    return Path(path).resolve()


def variant_of(item: pytest.Item, backend: Backend) -> TestVariant:
    """Name an instantiated upstream test the way spec files name it."""
    path = _resolved(str(item.path))
    cls = getattr(item, "cls", None)
    if cls is None:
        return TestVariant(path, None, getattr(item, "originalname", item.name))
    func = vars(cls).get(item.name)
    if func is None:
        func = getattr(cls, item.name, None)
    generic = getattr(func, "__name__", item.name)
    defaults = getattr(func, "__defaults__", None) or ()
    params: dict[str, Any] = defaults[0] if defaults and isinstance(defaults[0], dict) else {}
    class_name = cls.__name__
    if _is_device_class(cls) and class_name.endswith(backend.class_suffix):
        class_name = class_name[: -len(backend.class_suffix)]
    op = params.get("op")
    dtype = params.get("dtype")
    return TestVariant(
        file=path,
        class_name=class_name,
        test_name=generic,
        op=getattr(op, "name", None) if op is not None else None,
        module=_module_name(params.get("module_info")),
        dtype=dtype_name_of(dtype) if dtype is not None else None,
    )


def _override_precision(instance: Any, precision: Precision) -> None:
    """Make the spec's tolerance win over upstream defaults and decorators."""

    def apply() -> None:
        if precision.atol is not None:
            instance.precision = precision.atol
        if precision.rtol is not None:
            instance.rel_tol = precision.rtol

    upstream_apply: Callable[..., None] | None = getattr(
        instance, "_apply_precision_override_for_test", None
    )
    if upstream_apply is not None:

        def patched(*args: Any, **kwargs: Any) -> None:
            upstream_apply(*args, **kwargs)
            apply()

        instance._apply_precision_override_for_test = patched
    apply()


def _move_tensor_args_to_cpu(instance: Any, method_name: str) -> None:
    import torch
    from torch.utils._pytree import tree_map

    original = getattr(instance, method_name, None)
    if original is None:
        return

    def to_cpu(value: Any) -> Any:
        return value.cpu() if isinstance(value, torch.Tensor) else value

    def moved(*args: Any, **kwargs: Any) -> Any:
        return original(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))

    setattr(instance, method_name, moved)


def _seed_before_body(instance: Any, seed: int) -> None:
    """``torch.manual_seed(seed)`` after the test's ``setUp`` (a unittest case runs its
    ``setUp`` inside the call, and PyTorch's seeds with its own SEED there)."""
    import torch

    setup: Callable[[], None] | None = getattr(instance, "setUp", None)
    if setup is None:
        torch.manual_seed(seed)
        return

    def seeded() -> None:
        setup()
        torch.manual_seed(seed)

    instance.setUp = seeded


class ReuseSpecSession:
    """Per-session state: the merged spec, the backend and every decision made."""

    def __init__(
        self,
        spec: LoadedSpec,
        backend: Backend,
        label: str | None,
        only: set[str] | None = None,
        deselect: set[str] | None = None,
    ) -> None:
        self.spec = spec
        self.backend = backend
        self.label = label
        self.only = only
        self.deselect = deselect or set()
        self.decided: list[tuple[str, TestVariant, Decision]] = []

    def _generic_id(self, variant: TestVariant, root: Path) -> str:
        try:
            file = variant.file.relative_to(root).as_posix()
        except ValueError:
            file = variant.file.as_posix()
        parts = [file, variant.class_name, variant.test_name]
        return "::".join(p for p in parts if p)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        variants = {id(item): variant_of(item, self.backend) for item in items}  # once each
        if self.only is not None or self.deselect:
            root = (self.spec.upstream or config.rootpath).resolve()
            keep: list[pytest.Item] = []
            dropped: list[pytest.Item] = []
            for item in items:
                wanted = item.nodeid not in self.deselect and (
                    self.only is None or self._generic_id(variants[id(item)], root) in self.only
                )
                (keep if wanted else dropped).append(item)
            if dropped:
                config.hook.pytest_deselected(items=dropped)
                items[:] = keep
        on_device = self.backend.device_type != "cpu"
        for item in items:
            variant = variants[id(item)]
            decision = decide(self.spec, variant, self.label)
            if decision is None:
                continue
            if on_device and decision.mode is not Mode.SKIP and hardware_generic(item):
                # torch-spyre's framework skips these before the body runs: they would pass
                # on the CPU and make a green cell of a test that never touched the card
                if decision.listed:
                    item.user_properties.append((NOTE_PROPERTY, CPU_NOTE))
                else:
                    decision = dataclasses.replace(
                        decision, mode=Mode.SKIP, reason=HARDWARE_GENERIC
                    )
            item.stash[VARIANT_KEY] = variant
            item.stash[DECISION_KEY] = decision
            self.decided.append((item.nodeid, variant, decision))
            self._mark(item, decision)

    @staticmethod
    def _mark(item: pytest.Item, decision: Decision) -> None:
        item.user_properties.append(("reuse_spec.mode", decision.mode.value))
        item.user_properties.append(("reuse_spec.reason", decision.reason))
        for tag in decision.tags:
            item.add_marker(getattr(pytest.mark, tag))
            item.user_properties.append(("reuse_spec.tag", tag))
        if decision.mode is Mode.SKIP:
            item.add_marker(pytest.mark.skip(reason=f"reuse spec: {decision.reason}"))
        elif decision.mode in (Mode.XFAIL, Mode.XFAIL_STRICT):
            item.add_marker(
                pytest.mark.xfail(
                    reason=f"reuse spec: {decision.reason}",
                    strict=decision.mode is Mode.XFAIL_STRICT,
                )
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        decision = item.stash.get(DECISION_KEY, None)
        if decision is None or not (
            decision.precision or decision.no_grad or decision.cpu_move or decision.seed is not None
        ):
            return (yield)
        instance = getattr(item, "instance", None) or getattr(item, "_testcase", None)
        if decision.seed is not None:
            _seed_before_body(instance, decision.seed)
        if instance is not None:
            if decision.precision is not None:
                _override_precision(instance, decision.precision)
            for name in decision.cpu_move:
                _move_tensor_args_to_cpu(instance, name)
        grad_ctx: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if decision.no_grad:
            import torch

            grad_ctx = torch.no_grad()
        with grad_ctx:
            return (yield)
