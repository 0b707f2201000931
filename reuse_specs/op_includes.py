"""``edits.ops.include`` as torch-spyre means it: the named ops join an upstream test's
``@ops`` list on the device, so the test gets variants for ops upstream did not list.

The pytest plugin registers the loaded spec here before any test module is imported; the
Spyre device test class (:mod:`reuse_specs.devices.spyre_test_class`) asks, for each
``@ops`` test it instantiates, which ops the spec includes (PyTorch's
``_apply_op_overrides`` hook). The included ops then go through the spec like any other
variant: their dtypes are the spec's (global ``supported_dtypes``, the test's dtype edits),
and ``supported_ops`` does not filter them out.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from reuse_specs.loader import LoadedSpec
from reuse_specs.matching import TestVariant, find_rule

log = logging.getLogger("reuse_specs")
_spec: LoadedSpec | None = None


def register(spec: LoadedSpec | None) -> None:
    """The spec whose includes apply in this process (None: none)."""
    global _spec
    _spec = spec


def included_ops(file: Path, class_name: str, test_name: str) -> tuple[str, ...]:
    """Op names the spec's entry for this generic test includes (in spec order)."""
    if _spec is None:
        return ()
    variant = TestVariant(file.resolve(), class_name, test_name)
    for rules in _spec.rules_for(variant.file):
        found = find_rule(rules, variant)
        if found is not None:
            return tuple(i.name for i in found[0].entry.edits.ops.include)
    return ()


def extend_op_list(ops_decorator: Any, test: Any) -> list[str]:
    """Add the ops the spec includes for ``test`` to an ``@ops`` decorator's list, from
    PyTorch's own OpInfo database; the names found nowhere are returned (and logged)."""
    code = getattr(test, "__code__", None)
    qualname = getattr(test, "__qualname__", "")
    if code is None or "." not in qualname:
        return []
    class_name, test_name = qualname.split(".")[-2], qualname.split(".")[-1]
    wanted = included_ops(Path(code.co_filename), class_name, test_name)
    if not wanted:
        return []
    from torch.testing._internal.common_methods_invocations import op_db

    present = {op.full_name for op in ops_decorator.op_list}
    by_name = {op.full_name: op for op in op_db}
    missing = []
    for name in wanted:
        if name in present:
            continue
        op = by_name.get(name)
        if op is None:
            missing.append(name)
            continue
        ops_decorator.op_list.append(op)
        present.add(name)
    if missing:
        log.warning(
            "%s.%s: edits.ops.include names op(s) not in PyTorch's OpInfo database: %s",
            class_name,
            test_name,
            ", ".join(missing),
        )
    return missing
