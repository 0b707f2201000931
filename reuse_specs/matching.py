"""Decide, per test variant (test, op, module, dtype), what the spec says it must do.

Pure functions over a :class:`LoadedSpec`; the pytest plugin, ``specs show``
and the selector all ask the same question here, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from reuse_specs.loader import FileRules, LoadedSpec, NamePattern, TestRule
from reuse_specs.modes import Mode
from reuse_specs.schema import Precision, SupportedModule, SupportedOp
from reuse_specs.tiers import selects


@dataclass(frozen=True)
class TestVariant:
    """One concrete upstream test as pytest collects it, named generically.

    ``class_name`` and ``test_name`` are the generic (pre-instantiation) names
    that spec files use: ``TestBinaryUfuncs`` / ``test_add``, not
    ``TestBinaryUfuncsCPU`` / ``test_add_cpu_float32``.
    """

    __test__ = False

    file: Path
    class_name: str | None
    test_name: str
    op: str | None = None
    module: str | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class Decision:
    """The mode of one variant, why, and the runtime edits that go with it."""

    mode: Mode
    reason: str
    listed: bool
    tags: tuple[str, ...] = ()
    precision: Precision | None = None
    no_grad: bool = False
    cpu_move: tuple[str, ...] = ()
    seed: int | None = None  # global.input_config.seed: torch.manual_seed before the test


def _pattern_matches(pattern: NamePattern, variant: TestVariant) -> bool:
    if not fnmatchcase(variant.test_name, pattern.method_part):
        return False
    cls = pattern.class_part
    return cls is None or (variant.class_name is not None and fnmatchcase(variant.class_name, cls))


def find_rule(rules: FileRules, variant: TestVariant) -> tuple[TestRule, NamePattern] | None:
    """The entry listing this test: an exact name beats a glob; then first listed wins."""
    globbed: tuple[TestRule, NamePattern] | None = None
    for rule in rules.rules:
        for pattern in rule.names:
            if _pattern_matches(pattern, variant):
                if not pattern.is_glob:
                    return rule, pattern
                globbed = globbed or (rule, pattern)
    return globbed


def _bare_module(name: str) -> str:
    """``torch.nn.Linear`` and ``nn.Linear`` name the same module."""
    return name.removeprefix("torch.")


def _skip(reason: str, listed: bool, tags: tuple[str, ...]) -> Decision:
    return Decision(Mode.SKIP, reason, listed, tags)


def decide(spec: LoadedSpec, variant: TestVariant, label: str | None = None) -> Decision | None:
    """What the spec says about ``variant``; None when no spec file covers its file."""
    covering = spec.rules_for(variant.file)
    if not covering:
        return None
    match = next(
        ((rules, found) for rules in covering if (found := find_rule(rules, variant))), None
    )
    rules = match[0] if match else covering[0]
    if match is None:
        mode = rules.unlisted_test_mode
        return _apply_limits(
            rules,
            variant,
            None,
            Decision(
                mode,
                f"not listed; file {rules.location} has unlisted_test_mode {mode}",
                listed=False,
            ),
            label,
            rules.labels,
        )
    rule, pattern = match[1]
    entry = rule.entry
    how = "matched" if pattern.is_glob else "listed"
    base = Decision(
        entry.mode,
        f"{how} as {pattern.text!r} at {pattern.location}: {entry.mode}",
        listed=True,
        tags=tuple(entry.tags),
        no_grad=entry.no_grad,
        cpu_move=tuple(f.name for f in entry.edits.functions.cpu_move),
    )
    return _apply_limits(rules, variant, rule, base, label, tuple(entry.labels) or rules.labels)


def _apply_limits(
    rules: FileRules,
    variant: TestVariant,
    rule: TestRule | None,
    base: Decision,
    label: str | None,
    labels: tuple[str, ...],
) -> Decision:
    """Narrow a listed/unlisted mode by labels, supported ops/modules/dtypes and force_xfail."""
    tags = base.tags
    if label is not None and not selects(label, labels):
        return _skip(f"label {label!r} not among {list(labels) or 'no labels'}", base.listed, tags)
    if base.mode is Mode.SKIP:
        return base
    edits = rule.entry.edits if rule else None
    forced: list[str] = []
    precision: Precision | None = None

    dtype_included = (
        edits is not None
        and variant.dtype is not None
        and variant.dtype in {d.name for d in edits.dtypes.include}
    )
    targets: list[
        tuple[str, str, set[str], set[str], bool, SupportedOp | SupportedModule | None]
    ] = []
    if variant.op is not None:
        targets.append(
            (
                "op",
                variant.op,
                {i.name for i in edits.ops.exclude} if edits else set(),
                {i.name for i in edits.ops.include} if edits else set(),
                rules.global_config.supported_ops is not None,
                rules.supported_op(variant.op),
            )
        )
        if edits:
            tags += tuple(t for i in edits.ops.include if i.name == variant.op for t in i.tags)
    if variant.module is not None:
        targets.append(
            (
                "module",
                _bare_module(variant.module),
                {_bare_module(i.name) for i in edits.modules.exclude} if edits else set(),
                {_bare_module(i.name) for i in edits.modules.include} if edits else set(),
                rules.global_config.supported_modules is not None,
                rules.supported_module(variant.module),
            )
        )
    for kind, name, excluded, included, restricted, supported in targets:
        if name in excluded:
            return _skip(f"{kind} {name!r} excluded by the test's edits.{kind}s", base.listed, tags)
        if restricted and supported is None and name not in included:
            return _skip(f"{kind} {name!r} is not in global.supported_{kind}s", base.listed, tags)
        if supported is None:
            continue
        if supported.force_xfail:
            forced.append(f"{kind} {name!r} has force_xfail")
        if variant.dtype and supported.dtypes:
            own = next((d for d in supported.dtypes if d.name == variant.dtype), None)
            if own is None and not dtype_included:
                return _skip(
                    f"dtype {variant.dtype} is not among {kind} {name!r}'s supported dtypes",
                    base.listed,
                    tags,
                )
            precision = precision or (own.precision if own else None)

    if variant.dtype is not None:
        dtype = variant.dtype
        include = (
            next((d for d in edits.dtypes.include if d.name == dtype), None) if edits else None
        )
        if edits and dtype in {d.name for d in edits.dtypes.exclude}:
            return _skip(f"dtype {dtype} excluded by the test's edits.dtypes", base.listed, tags)
        global_dtype = rules.supported_dtype(dtype)
        if include is None and rules.global_config.supported_dtypes and global_dtype is None:
            return _skip(f"dtype {dtype} is not in global.supported_dtypes", base.listed, tags)
        if include is not None:
            precision = include.precision or precision
            if include.force_xfail:
                forced.append(f"dtype {dtype} has force_xfail in the test's edits")
        if global_dtype is not None:
            precision = precision or global_dtype.precision
            if global_dtype.force_xfail:
                forced.append(f"dtype {dtype} has force_xfail in global.supported_dtypes")

    mode, reason = base.mode, base.reason
    if forced and mode is Mode.MANDATORY_SUCCESS:
        mode, reason = Mode.XFAIL, f"{reason}; xfail because {', '.join(forced)}"
    return Decision(
        mode,
        reason,
        base.listed,
        tags,
        precision,
        base.no_grad,
        base.cpu_move,
        rules.global_config.input_config.seed,
    )
