"""The test names an upstream test file defines, read with ``ast`` (never imported).

Enough for ``specs check`` to tell a misspelt test name from a real one in
milliseconds, without torch installed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class FileTests:
    """Classes with their ``test*`` methods, plus module-level functions."""

    classes: dict[str, frozenset[str]]
    functions: frozenset[str]
    syntax_error: str | None = None
    # classes the module instantiates per device (``instantiate_device_type_tests(C, ...)``):
    # the others are hardware-generic, they never get a device
    device_classes: frozenset[str] = frozenset()


@lru_cache(maxsize=4096)
def _index(path: Path, mtime_ns: int) -> FileTests:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        return FileTests({}, frozenset(), f"line {exc.lineno}: {exc.msg}")
    classes: dict[str, frozenset[str]] = {}
    functions: set[str] = set()
    device_classes: set[str] = set()
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "instantiate_device_type_tests"
            and call.args
            and isinstance(call.args[0], ast.Name)
        ):
            device_classes.add(call.args[0].id)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = frozenset(
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and item.name.startswith("test")
            )
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.add(node.name)
    return FileTests(classes, frozenset(functions), device_classes=frozenset(device_classes))


def index_test_file(path: Path) -> FileTests:
    """Index one file; cached until the file changes."""
    return _index(path, path.stat().st_mtime_ns)


def generic_test_ids(path: Path, root: Path) -> list[str]:
    """Every generic test the file defines as a node id relative to ``root``
    (``test/test_x.py::TestX::test_y``, ``test/test_x.py::test_z``): what a shard is handed
    before device instantiation turns each into its variants."""
    rel = path.relative_to(root).as_posix()
    index = index_test_file(path)
    ids = [f"{rel}::{cls}::{m}" for cls, methods in index.classes.items() for m in sorted(methods)]
    return ids + [f"{rel}::{f}" for f in sorted(index.functions) if f.startswith("test")]
