"""Does an emulator profile refuse what the specs say the card refuses, and run what they
say it runs?

A spec's ``global.supported_dtypes`` / ``supported_ops`` (and a test's
``edits.ops.include``) state what the card does; a ``spyre-emu`` profile states what the
emulator lets through. When they disagree, spyre-emu results mislead: a dtype or op the spec
supports but the profile refuses fails every variant on the emulator only, and one the spec
marks ``force_xfail`` but the profile runs XPASSes, i.e. the emulator is greener than the card.

Spec op names are of several kinds (:mod:`spyre_emu.op_names`): OpInfo names, in short
forms too, are traced: up to :data:`SAMPLES_PER_OP` of PyTorch's own OpInfo sample inputs run
on the CPU under a dispatch mode that records the aten overloads they reach and the dtypes of
the tensors in and out, which is the level the emulator decides at (after composite
decompositions: ``linalg.norm`` reaches ``linalg_vector_norm``; ``frexp`` makes an int32
exponent). aten names and the card's kernel names (through the alias table) are asked of the
profile directly. A name none of these know is a warning that says what was tried.
``supported_modules`` are traced the same way through ModuleInfo's forward inputs.

This module belongs to the emulator, not to ``reuse_specs``: the emulator knows the spec
format, while the specs (and the real-card path) never need the emulator.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from reuse_specs.errors import SourceLocation
from reuse_specs.schema import SpecFile, SupportedModule, SupportedOp
from reuse_specs.yaml_source import PathKey, YamlDocument, load_yaml
from spyre_emu.op_names import AtenName, OpNames, Unresolved, op_names, opinfo_aten_targets
from spyre_emu.profile import ESSENTIAL_OPS, SpyreProfile, dtype_name

SAMPLES_PER_OP = 3
"""Sample inputs traced per OpInfo: the first few already reach the op's kernels; more only
add time. With 3, the check's prediction matched the emulator on 669 of 670 OpInfos
(bench/bench_profile_parity.py)."""

PLUMBING_DTYPES = frozenset({torch.int64, torch.bool})
"""Dtypes a profile keeps whatever the card computes in: indices and masks must exist on the
device (see :mod:`spyre_emu.profile`), so no spec needs to list them."""

Severity = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Finding:
    """One disagreement between the specs and the profile, at the spec line to look at."""

    severity: Severity
    location: SourceLocation | str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.severity}: {self.message}"


@dataclass(frozen=True)
class OpTrace:
    """The aten overloads one OpInfo reached on the CPU, and with which dtype."""

    op_name: str
    dtype: Any | None
    aten: tuple[Any, ...]  # torch._ops.OpOverload
    problem: str | None = None
    tensor_dtypes: frozenset[Any] = frozenset()  # of the non-empty tensors in and out


@dataclass(frozen=True)
class ParityReport:
    """Everything compared: findings plus what was traced, for the summary line."""

    findings: list[Finding]
    traced: list[OpTrace]
    profile: SpyreProfile

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]


class _RecordAten(TorchDispatchMode):  # type: ignore[misc]
    """Collect every aten overload dispatched while active, and the dtypes of the non-empty
    tensors going in and out (on the device, each of them would be a device tensor: the
    emulator refuses to hold data of a dtype its profile lacks)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Any] = {}
        self.dtypes: set[Any] = set()

    def _note_dtypes(self, tree: Any) -> None:
        for leaf in tree_leaves(tree):
            if isinstance(leaf, torch.Tensor) and leaf.numel() != 0:
                self.dtypes.add(leaf.dtype)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.setdefault(str(func), func)
        kwargs = kwargs or {}
        self._note_dtypes((args, kwargs))
        result = func(*args, **kwargs)
        self._note_dtypes(result)
        return result


def _trace(name: str, supported: Any, dtypes: Sequence[Any], run: Any) -> OpTrace:
    """Call ``run(dtype, recorder)`` with the first of ``dtypes`` in ``supported``."""
    dtype = next((d for d in dtypes if d in supported), None)
    if dtype is None:
        wanted = ", ".join(dtype_name(d) for d in dtypes) or "none"
        return OpTrace(name, None, (), f"no dtype the spec gives ({wanted}) runs it on the CPU")
    recorder = _RecordAten()
    problem = None
    try:
        run(dtype, recorder)
    except Exception as exc:  # an upstream sample that fails is reported, not fatal
        problem = f"{type(exc).__name__}: {exc}"[:200]
    return OpTrace(name, dtype, tuple(recorder.seen.values()), problem, frozenset(recorder.dtypes))


def _module_db() -> list[Any]:
    from torch.testing._internal.common_modules import module_db

    return list(module_db)


def first_samples(opinfo: Any, dtype: Any) -> Iterator[Any]:
    """The OpInfo's first :data:`SAMPLES_PER_OP` CPU sample inputs in ``dtype``: the ones the
    check traces (and the parity bench replays on the device)."""
    return itertools.islice(opinfo.sample_inputs("cpu", dtype, requires_grad=False), SAMPLES_PER_OP)


def trace_op(opinfo: Any, dtypes: Sequence[Any]) -> OpTrace:
    """Run :func:`first_samples` of an OpInfo with the first of ``dtypes`` it supports on
    the CPU; record the aten overloads reached."""

    def run(dtype: Any, recorder: _RecordAten) -> None:
        for sample in first_samples(opinfo, dtype):
            with recorder:
                opinfo.op(sample.input, *sample.args, **sample.kwargs)

    return _trace(opinfo.full_name, opinfo.supported_dtypes("cpu"), dtypes, run)


def trace_module(info: Any, dtypes: Sequence[Any]) -> OpTrace:
    """The same for a ModuleInfo: build the module from its own constructor inputs (outside
    the recording, as a test builds it on the host before moving it) and trace forward."""

    def run(dtype: Any, recorder: _RecordAten) -> None:
        inputs = info.module_inputs_func(
            info, device="cpu", dtype=dtype, requires_grad=False, training=False
        )
        for module_input in [m for m in inputs if m.forward_input is not None][:SAMPLES_PER_OP]:
            built = module_input.constructor_input
            module = info.module_cls(*built.args, **built.kwargs).to(dtype)
            forward = module_input.forward_input
            with recorder:
                module(*forward.args, **forward.kwargs)

    return _trace(info.name, info.dtypes, dtypes, run)


def refused(profile: SpyreProfile, trace: OpTrace) -> list[str]:
    """What of the trace the profile refuses: aten overloads (``aten::name.overload``) and
    dtypes of tensors that would live on the device (``dtype float64``)."""
    allowed = set(profile.dtypes)
    dtypes = sorted(f"dtype {dtype_name(d)}" for d in trace.tensor_dtypes if d not in allowed)
    return refused_overloads(profile, trace) + dtypes


def refused_overloads(profile: SpyreProfile, trace: OpTrace) -> list[str]:
    """The traced aten overloads the profile refuses, as ``aten::name.overload``."""
    return sorted(
        {
            _qualified(o)
            for o in trace.aten
            if not profile.allows_op(o._schema.name, o._overloadname)
        }
    )


def _qualified(overload: Any) -> str:
    """``aten::div.Tensor_mode``: how the emulator's errors name an overload."""
    return f"{overload._schema.name}.{overload._overloadname}"


def _essential(overload: Any) -> bool:
    """Allocation/copy/view plumbing every profile allows (not worth naming in a message)."""
    name = overload._schema.name.removeprefix("aten::")
    return name in ESSENTIAL_OPS or f"{name}.{overload._overloadname}" in ESSENTIAL_OPS


def _dtype(name: str) -> Any:
    return getattr(torch, name)


@dataclass(frozen=True)
class _SpecGlobal:
    doc: YamlDocument
    spec: SpecFile

    def at(self, *path: str | int) -> SourceLocation:
        key: PathKey = ("test_suite_config", "global", *path)
        return self.doc.locate(key)


def _read(paths: Iterable[Path]) -> list[_SpecGlobal]:
    """Spec files already validated by ``load_specs``: read again for their positions."""
    return [
        _SpecGlobal(doc, SpecFile.model_validate(doc.data))
        for doc in (load_yaml(p, str(p)) for p in paths)
    ]


def _check_dtypes(specs: list[_SpecGlobal], profile: SpyreProfile, where: str) -> list[Finding]:
    findings: list[Finding] = []
    allowed = set(profile.dtypes)
    listed: set[Any] = set()
    for spec in specs:
        glob = spec.spec.test_suite_config.global_
        for i, item in enumerate(glob.supported_dtypes):
            dtype = _dtype(item.name)
            listed.add(dtype)
            loc = spec.at("supported_dtypes", i)
            if not item.force_xfail and dtype not in allowed:
                findings.append(
                    Finding(
                        "error",
                        loc,
                        f"the spec supports {item.name} but profile {profile.name!r} refuses "
                        f"it: every {item.name} variant fails on spyre-emu only "
                        f"(profile dtypes: {profile.dtype_names})",
                    )
                )
            elif item.force_xfail and dtype in allowed:
                plumbing = dtype in PLUMBING_DTYPES
                why = (
                    " (profiles keep it for indices and masks)"
                    if plumbing
                    else f"; if the card refuses it, drop it from the profile's dtypes ({where})"
                )
                findings.append(
                    Finding(
                        "note" if plumbing else "warning",
                        loc,
                        f"{item.name} has force_xfail but profile {profile.name!r} accepts it: "
                        f"its variants may XPASS on spyre-emu{why}",
                    )
                )
        for i, op in enumerate(glob.supported_ops or ()):
            for j, op_dtype in enumerate(op.dtypes):
                if not op.force_xfail and _dtype(op_dtype.name) not in allowed:
                    findings.append(
                        Finding(
                            "error",
                            spec.at("supported_ops", i, "dtypes", j),
                            f"op {op.name!r} is supported in {op_dtype.name} but profile "
                            f"{profile.name!r} refuses that dtype",
                        )
                    )
    if listed:  # only specs that state their dtypes say what the card refuses
        for dtype in profile.dtypes:
            if dtype in listed or dtype in PLUMBING_DTYPES:
                continue
            findings.append(
                Finding(
                    "error",
                    where,
                    f"profile {profile.name!r} accepts {dtype_name(dtype)}, which no spec's "
                    "global.supported_dtypes lists: spyre-emu would pass what the card refuses",
                )
            )
    return findings


def _op_dtypes(
    op: SupportedOp | SupportedModule | None, spec: SpecFile, profile: SpyreProfile
) -> list[Any]:
    """The dtypes to trace with: the op's own, else the spec's supported ones, else the
    profile's (in that order; force_xfail dtypes last)."""
    if op is not None and op.dtypes:
        return [_dtype(d.name) for d in op.dtypes]
    items = spec.test_suite_config.global_.supported_dtypes
    if items:
        ordered = sorted(items, key=lambda d: d.force_xfail)
        return [_dtype(d.name) for d in ordered]
    return list(profile.dtypes)


def _check_traces(
    traces: list[OpTrace],
    label: str,
    force_xfail: bool,
    loc: SourceLocation,
    profile: SpyreProfile,
    traced: list[OpTrace],
) -> list[Finding]:
    findings: list[Finding] = []
    for trace in traces:
        traced.append(trace)
        if trace.problem is not None and not trace.aten:
            findings.append(
                Finding("note", loc, f"{label} {trace.op_name!r}: not traced ({trace.problem})")
            )
            continue
        refusals = refused(profile, trace)
        if refusals and not force_xfail:
            findings.append(
                Finding(
                    "error",
                    loc,
                    f"{label} {trace.op_name!r} reaches {', '.join(refusals)}, which profile "
                    f"{profile.name!r} refuses: its variants fail on spyre-emu only "
                    "(mark it force_xfail if the card refuses it too)",
                )
            )
        elif not refusals and force_xfail:
            reached = sorted(
                {
                    _qualified(o)
                    for o in trace.aten
                    if profile.allows_op(o._schema.name, o._overloadname) and not _essential(o)
                }
            )
            findings.append(
                Finding(
                    "warning",
                    loc,
                    f"{label} {trace.op_name!r} has force_xfail but profile {profile.name!r} "
                    f"runs every aten op it reaches ({', '.join(reached) or 'plumbing only'}): "
                    "its variants may XPASS on spyre-emu (put the card's missing ones in the "
                    "profile's unsupported_ops)",
                )
            )
    return findings


def _check_aten(
    resolved: AtenName,
    label: str,
    force_xfail: bool,
    loc: SourceLocation,
    profile: SpyreProfile,
    explain: bool = True,
) -> list[Finding]:
    """A name that is an aten op (or one of the card's kernels for aten ops): no OpInfo
    samples to trace, so the profile is asked about the ops themselves (every overload of a
    bare name: the spec says the op runs, whatever the overload)."""
    refusals = sorted({o for t in resolved.targets for o in _refused_targets(profile, t)})
    name = resolved.name
    what = f"{label} {name!r} ({resolved.how})"
    if refusals and not force_xfail:
        return [
            Finding(
                "error",
                loc,
                f"{what}: profile {profile.name!r} refuses {', '.join(refusals)}, so its "
                "variants fail on spyre-emu only (mark it force_xfail if the card refuses it)",
            )
        ]
    if not refusals and force_xfail:
        return [
            Finding(
                "warning",
                loc,
                f"{what} has force_xfail but profile {profile.name!r} runs it: the variants "
                "that reach it may XPASS on spyre-emu (put it in the profile's unsupported_ops)",
            )
        ]
    if not explain:
        return []
    return [
        Finding(
            "note",
            loc,
            f"{what}: not an OpInfo name, so no test variant is named after it; profile "
            f"{profile.name!r} {'refuses' if refusals else 'runs'} it",
        )
    ]


def _refused_targets(profile: SpyreProfile, target: str) -> list[str]:
    """The overloads of aten pattern ``target`` (``div`` or ``div.Tensor``) the profile
    refuses, as ``aten::div.Tensor``."""
    base, _, overload = target.partition(".")
    packet = getattr(torch.ops.aten, base)
    overloads = [overload] if overload else packet.overloads()
    return [f"aten::{base}.{o}" for o in overloads if not profile.allows_op(f"aten::{base}", o)]


def _unresolved(label: str, key: str, resolved: Unresolved, loc: SourceLocation) -> Finding:
    return Finding(
        "warning",
        loc,
        f"{key} lists {resolved.name!r}, which names no OpInfo, aten op or known card kernel "
        f"(torch {torch.__version__}; {resolved.how}): the profile cannot be checked for it "
        f"and no test variant has that {label}",
    )


def _check_op(
    names: OpNames,
    spec: _SpecGlobal,
    op: SupportedOp,
    loc: SourceLocation,
    profile: SpyreProfile,
    traced: list[OpTrace],
) -> list[Finding]:
    resolved = names.resolve(op.name)
    if isinstance(resolved, Unresolved):
        return [_unresolved("op", "supported_ops", resolved, loc)]
    if isinstance(resolved, AtenName):
        return _check_aten(resolved, "op", op.force_xfail, loc, profile)
    dtypes = _op_dtypes(op, spec.spec, profile)
    traces = [trace_op(opinfo, dtypes) for opinfo in resolved.opinfos]
    findings = _check_traces(traces, "op", op.force_xfail, loc, profile, traced)
    if all(t.problem is not None and not t.aten for t in traces):
        # nothing traced (no CPU sample in the spec's dtypes): ask about the aten op itself
        aten = opinfo_aten_targets(resolved.opinfos)
        if aten:
            via = AtenName(op.name, aten)
            checked = _check_aten(via, "op", op.force_xfail, loc, profile, explain=False)
            findings += checked or [
                Finding("note", loc, f"op {op.name!r}: checked as {via.how} instead: it runs")
            ]
    return findings


def _check_ops(
    specs: list[_SpecGlobal], profile: SpyreProfile, traced: list[OpTrace]
) -> list[Finding]:
    names = op_names()
    modules = {info.name: info for info in _module_db()}
    findings: list[Finding] = []
    for spec in specs:
        suite = spec.spec.test_suite_config
        for i, op in enumerate(suite.global_.supported_ops or ()):
            loc = spec.at("supported_ops", i)
            findings += _check_op(names, spec, op, loc, profile, traced)
        for i, file in enumerate(suite.files):
            for j, test in enumerate(file.tests):
                for k, include in enumerate(test.edits.ops.include):
                    key: PathKey = (
                        "test_suite_config",
                        "files",
                        i,
                        "tests",
                        j,
                        "edits",
                        "ops",
                        "include",
                        k,
                    )
                    loc = spec.doc.locate(key)
                    findings += _check_include(names, spec, include.name, loc, profile, traced)
        for i, module in enumerate(suite.global_.supported_modules or ()):
            loc = spec.at("supported_modules", i)
            bare = module.name.removeprefix("torch.")
            info = modules.get(bare)
            if info is None:
                findings.append(
                    Finding(
                        "warning",
                        loc,
                        f"supported_modules lists {module.name!r}, which PyTorch's ModuleInfo "
                        f"database (torch {torch.__version__}) does not have (tried {bare}): "
                        "no test variant has it and the profile cannot be checked for it",
                    )
                )
                continue
            dtypes = _op_dtypes(module, spec.spec, profile)
            findings += _check_traces(
                [trace_module(info, dtypes)], "module", module.force_xfail, loc, profile, traced
            )
    return findings


def _check_include(
    names: OpNames,
    spec: _SpecGlobal,
    name: str,
    loc: SourceLocation,
    profile: SpyreProfile,
    traced: list[OpTrace],
) -> list[Finding]:
    """``edits.ops.include`` adds OpInfo variants by full name: anything else adds nothing."""
    resolved = names.resolve(name, variant=True)
    if isinstance(resolved, Unresolved):
        return [_unresolved("op", "edits.ops.include", resolved, loc)]
    if isinstance(resolved, AtenName):
        return [
            Finding(
                "warning",
                loc,
                f"edits.ops.include names {name!r}, {resolved.how}, not an OpInfo: includes add "
                "OpInfo variants, so nothing is added",
            )
        ]
    (opinfo,) = resolved.opinfos
    if opinfo.full_name != name:
        return [
            Finding(
                "warning",
                loc,
                f"edits.ops.include names {name!r}, OpInfo {opinfo.full_name!r} by a short "
                f"name: includes take the full name, so nothing is added as written "
                f"(write {opinfo.full_name!r})",
            )
        ]
    traces = [trace_op(opinfo, _op_dtypes(None, spec.spec, profile))]
    return _check_traces(traces, "included op", False, loc, profile, traced)


def _position(location: SourceLocation | str) -> tuple[str, int, int]:
    if isinstance(location, SourceLocation):
        return location.file, location.line, location.column
    return location, 0, 0


def check_profile_parity(
    spec_paths: Sequence[Path], profile: SpyreProfile, profile_where: str
) -> ParityReport:
    """Compare validated spec files with ``profile`` (read from ``profile_where``)."""
    specs = _read(spec_paths)
    traced: list[OpTrace] = []
    findings = _check_dtypes(specs, profile, profile_where)
    findings += _check_ops(specs, profile, traced)
    order = {"error": 0, "warning": 1, "note": 2}
    findings.sort(key=lambda f: (order[f.severity], *_position(f.location)))
    return ParityReport(findings, traced, profile)
