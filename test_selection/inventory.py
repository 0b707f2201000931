"""The upstream test inventory: every test function, read with ``ast`` (never imported).

Built from git objects at a revision, cached per blob (an unchanged file is
parsed once, ever) and per tree (an unchanged tree is loaded, not rebuilt).
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import json
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from test_selection.git import Repo
from test_selection.layout import DEFAULT_PATTERNS, NO_RECURSE
from test_selection.test_bodies import tokens
from test_selection.types import TestId

__all__ = ["DEFAULT_PATTERNS", "Inventory", "TestFile", "TestFunction", "build_inventory"]
INVENTORY_FORMAT = 4  # 4: a test's source starts at its first decorator
MAX_SOURCE_CHARS = 4000


@dataclass
class TestFunction:
    __test__ = False

    id: TestId
    lineno: int
    end_lineno: int
    decorators: list[str]
    references: list[str]
    source: str

    @cached_property
    def tokens(self) -> frozenset[str]:
        """Its identifiers, read as the backtest reads past versions (``test_bodies``)."""
        return tokens(self.source)

    @property
    def lines(self) -> int:
        return self.end_lineno - self.lineno + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "id": [self.id.file, self.id.cls, self.id.name],
            "lines": [self.lineno, self.end_lineno],
            "decorators": self.decorators,
            "references": self.references,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestFunction:
        file, klass, name = data["id"]
        return cls(
            TestId(file, klass, name),
            data["lines"][0],
            data["lines"][1],
            data["decorators"],
            data["references"],
            data["source"],
        )


@dataclass
class TestFile:
    __test__ = False

    path: str
    blob: str
    tests: list[TestFunction]
    device_classes: list[str]
    syntax_error: str | None = None
    imports: list[str] = field(default_factory=list)  # modules, and module.name of from-imports


@dataclass
class Inventory:
    tree: str
    files: dict[str, TestFile] = field(default_factory=dict)

    def tests(self) -> list[TestFunction]:
        return self._tests

    @cached_property
    def _tests(self) -> list[TestFunction]:
        return [t for f in self.files.values() for t in f.tests]

    def by_id(self) -> dict[TestId, TestFunction]:
        return self._by_id

    @cached_property
    def _by_id(self) -> dict[TestId, TestFunction]:
        return {t.id: t for t in self._tests}

    @cached_property
    def reference_counts(self) -> Counter[str]:
        """How many tests use each name (rare names are stronger evidence)."""
        counts: Counter[str] = Counter()
        for test in self._tests:
            counts.update(test.references)
        return counts


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _names(node: ast.AST) -> set[str]:
    """Identifiers, dotted names (and their last part) and identifier-like strings in a tree."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            dotted = _dotted(sub)
            out.add(sub.attr)
            if dotted:
                out.add(dotted)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            value = sub.value
            if 0 < len(value) <= 60 and value.replace(".", "").replace("_", "").isalnum():
                out.add(value)
                out.add(value.rsplit(".", 1)[-1])
    return out


def parse_test_file(path: str, blob: str, source: bytes) -> TestFile:
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError) as exc:
        return TestFile(path, blob, [], [], f"{type(exc).__name__}: {exc}")
    # whole lines, split once: ast.get_source_segment splits the file again on every call
    # (quadratic: 116 s for pytorch/rl's 125 test files, most of it there)
    lines = source.decode("utf-8", errors="replace").splitlines(keepends=True)
    module_vars: dict[str, set[str]] = {}
    device_classes: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    module_vars[target.id] = _names(node.value)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = _dotted(node.value.func) or ""
            if func.endswith("instantiate_device_type_tests") and node.value.args:
                first = node.value.args[0]
                if isinstance(first, ast.Name):
                    device_classes.append(first.id)
    tests: list[TestFunction] = []
    imports: set[str] = set()
    for found in ast.walk(tree):
        if isinstance(found, ast.Import):
            imports.update(alias.name for alias in found.names)
        elif isinstance(found, ast.ImportFrom) and found.module and not found.level:
            imports.add(found.module)
            imports.update(f"{found.module}.{alias.name}" for alias in found.names)

    def add(fn: ast.FunctionDef | ast.AsyncFunctionDef, cls: str | None) -> None:
        decorators = [
            (_dotted(d.func if isinstance(d, ast.Call) else d) or "?") for d in fn.decorator_list
        ]
        refs = _names(fn)
        for var in list(refs):  # @ops(_binary_ops): the ops named where the list is built
            refs |= module_vars.get(var, set())
        start = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
        segment = "".join(lines[start - 1 : fn.end_lineno or fn.lineno])
        tests.append(
            TestFunction(
                TestId(path, cls, fn.name),
                fn.lineno,
                fn.end_lineno or fn.lineno,
                decorators,
                sorted(refs),
                segment[:MAX_SOURCE_CHARS],
            )
        )

    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(
                    item, ast.FunctionDef | ast.AsyncFunctionDef
                ) and item.name.startswith("test"):
                    add(item, node.name)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            add(node, None)
    return TestFile(path, blob, tests, device_classes, imports=sorted(imports))


def is_test_path(path: str, patterns: tuple[str, ...] = DEFAULT_PATTERNS) -> bool:
    """A test file by the patterns, outside the folders pytest never enters (``.git``-like
    hidden folders, build output, virtual environments)."""
    if not any(fnmatch.fnmatchcase(path, p) for p in patterns):
        return False
    folders = path.split("/")[:-1]
    return not any(fnmatch.fnmatchcase(d, n) for d in folders for n in NO_RECURSE)


def default_cache_dir() -> Path:
    """Where caches go when the caller names no folder: the user's cache folder (XDG)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "ci-relay"


class InventoryCache:
    """Parsed files by blob id and whole inventories by tree id, as JSON on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, kind: str, key: str) -> Path:
        return self.root / f"v{INVENTORY_FORMAT}" / kind / key[:2] / f"{key}.json"

    def load(self, kind: str, key: str) -> Any | None:
        path = self._path(kind, key)
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def store(self, kind: str, key: str, data: Any) -> None:
        path = self._path(kind, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # unique per writer: threads of one worker process share its pid
        tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)  # atomic: concurrent builders never see half a file


def _file_json(f: TestFile) -> dict[str, Any]:
    return {
        "path": f.path,
        "blob": f.blob,
        "device_classes": f.device_classes,
        "syntax_error": f.syntax_error,
        "imports": f.imports,
        "tests": [t.to_json() for t in f.tests],
    }


def _file_from_json(data: dict[str, Any]) -> TestFile:
    return TestFile(
        data["path"],
        data["blob"],
        [TestFunction.from_json(t) for t in data["tests"]],
        data["device_classes"],
        data["syntax_error"],
        data.get("imports", []),
    )


def build_inventory(
    repo: Repo,
    rev: str,
    patterns: tuple[str, ...] = DEFAULT_PATTERNS,
    cache_dir: Path | None = None,
) -> Inventory:
    """All test functions at ``rev``; cached so an unchanged tree is never re-parsed."""
    cache = InventoryCache(cache_dir or default_cache_dir())
    tree = repo.tree_id(rev)
    key = hashlib.sha256(f"{tree}|{'|'.join(patterns)}".encode()).hexdigest()
    memory_key = f"{cache.root}|{key}"
    if memory_key in _MEMORY:
        return _MEMORY[memory_key]
    cached = cache.load("tree", key)
    if cached is not None:
        loaded = {p: _file_from_json(f) for p, f in cached.items()}
        return _remember(memory_key, Inventory(tree, loaded))
    files = {p: b for p, b in repo.ls_tree(rev).items() if is_test_path(p, patterns)}
    inventory = Inventory(tree)
    missing: list[tuple[str, str]] = []
    for path, blob in files.items():
        data = cache.load("blob", f"{blob}-{hashlib.sha1(path.encode()).hexdigest()[:8]}")
        if data is not None:
            inventory.files[path] = _file_from_json(data)
        else:
            missing.append((path, blob))
    for start in range(0, len(missing), 500):
        chunk = missing[start : start + 500]
        contents = repo.read_blobs([b for _, b in chunk])
        for path, blob in chunk:
            parsed = parse_test_file(path, blob, contents[blob])
            inventory.files[path] = parsed
            cache.store(
                "blob", f"{blob}-{hashlib.sha1(path.encode()).hexdigest()[:8]}", _file_json(parsed)
            )
    cache.store("tree", key, {p: _file_json(f) for p, f in inventory.files.items()})
    return _remember(memory_key, inventory)


_MEMORY: dict[str, Inventory] = {}
_MEMORY_SIZE = 4  # a worker keeps the last few trees it saw in memory


def _remember(key: str, inventory: Inventory) -> Inventory:
    if len(_MEMORY) >= _MEMORY_SIZE:
        _MEMORY.pop(next(iter(_MEMORY)))
    _MEMORY[key] = inventory
    return inventory
