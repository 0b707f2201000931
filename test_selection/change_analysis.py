"""Stage 1: what a change touched — files, hunks, Python symbols, tests and operators.

Symbols are compared by AST, not by line ranges: a function counts as changed
when its parsed form differs between base and head, so a reformat that moves
lines is not a change and an edit inside a long function names that function.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from test_selection.git import Repo
from test_selection.inventory import DEFAULT_PATTERNS, is_test_path
from test_selection.types import TestId

MAX_FILES = 5000  # past this, symbols are not parsed (a merge or vendor drop): paths only
MAX_PARSED = 200  # Python files whose symbols are compared; the rest of a sweep is paths only
MAX_DIFF_LINES = 200_000  # changed lines read for hunks; a bigger change is paths only
MAX_HUNK_TEXT = 2000
OP_SCHEMA = "native_functions.yaml"
_FUNC_LINE = re.compile(r"^[+-]\s*-?\s*func:\s*([A-Za-z0-9_]+)")
_OPINFO_LINE = re.compile(r"(?:OpInfo|UfuncInfo|ReductionInfo|[A-Z]\w*Info)\(\s*['\"]([\w.]+)['\"]")
_DECOMP = re.compile(r"aten\.([A-Za-z0-9_]+)")
_OP_SOURCE_DIRS = ("torch/_refs", "torch/_decomp", "torch/_prims", "torch/nn/functional")


@dataclass
class FileChange:
    path: str
    status: str  # A M D R
    old_path: str | None = None
    binary: bool = False
    hunks: list[tuple[int, int, int, int]] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)  # git's hunk headers (enclosing def/class)

    @property
    def hunk_text(self) -> str:
        return "\n".join(self.removed + self.added)[:MAX_HUNK_TEXT]


@dataclass
class ChangeAnalysis:
    base: str
    head: str
    files: list[FileChange]
    symbols: set[str] = field(default_factory=set)  # qualified: path:Class.func
    # changed functions whose change is confined to statements of their body: the first
    # line of each statement it touched, numbered as at the base (``body_lines``)
    lines: dict[str, frozenset[int]] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)  # bare names of changed symbols
    tests_added: set[TestId] = field(default_factory=set)
    tests_modified: set[TestId] = field(default_factory=set)
    tests_removed: set[TestId] = field(default_factory=set)
    ops: set[str] = field(default_factory=set)
    parse_errors: list[str] = field(default_factory=list)
    truncated: bool = False
    patterns: tuple[str, ...] = DEFAULT_PATTERNS

    @property
    def source_files(self) -> list[FileChange]:
        return [f for f in self.files if not is_test_path(f.path, self.patterns)]

    def summary(self) -> dict[str, Any]:
        return {
            "files": [
                {"path": f.path, "status": f.status, "binary": f.binary} for f in self.files[:500]
            ],
            "file_count": len(self.files),
            "symbols": sorted(self.symbols)[:500],
            "tests_added": sorted(t.nodeid for t in self.tests_added),
            "tests_modified": sorted(t.nodeid for t in self.tests_modified),
            "tests_removed": sorted(t.nodeid for t in self.tests_removed),
            "ops": sorted(self.ops),
            "parse_errors": self.parse_errors,
            "truncated": self.truncated,
        }


def _parse_diff(text: str) -> dict[str, FileChange]:
    """Hunks and changed lines per file from ``git diff -U0``."""
    out: dict[str, FileChange] = {}
    current: FileChange | None = None
    for line in text.splitlines():
        if line.startswith("diff --git "):
            current = None
        elif line.startswith("+++ "):
            path = line[4:].removeprefix("b/")
            if path != "/dev/null":
                current = out.setdefault(path, FileChange(path, "M"))
        elif line.startswith("--- "):
            path = line[4:].removeprefix("a/")
            if path != "/dev/null":
                current = out.setdefault(path, FileChange(path, "M"))
        elif line.startswith("@@") and current is not None:
            m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)", line)
            if m:
                current.hunks.append((int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1)))
                if m[5]:
                    current.contexts.append(m[5])
        elif current is not None and line[:1] in "+-" and not line.startswith(("+++", "---")):
            (current.added if line[0] == "+" else current.removed).append(line[1:])
    return out


_Span = tuple[ast.AST, int, int]  # a def, class body or assignment, and its first/last line


@lru_cache(maxsize=64)
def _defs(source: bytes | None, path: str) -> tuple[dict[str, _Span], str | None]:
    """Qualified def/class name -> the node to compare and the lines it spans (kept for the
    next selection of the same change: one per backend, and the backtest's replays)."""
    if source is None:
        return {}, None
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError) as exc:
        return {}, f"{path}: does not parse ({type(exc).__name__}: {exc}); using changed lines only"
    out: dict[str, _Span] = {}

    def span(node: ast.stmt) -> tuple[int, int]:
        decorators = getattr(node, "decorator_list", [])
        start = min([node.lineno, *(d.lineno for d in decorators)])
        return start, node.end_lineno or node.lineno

    def walk(nodes: list[ast.stmt], prefix: str) -> None:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{node.name}"
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{name}.")
                    body = [
                        n
                        for n in node.body
                        if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                    ]
                    out[name] = (ast.Module(body=body, type_ignores=[]), *span(node))
                else:
                    out[name] = (node, *span(node))
            elif not prefix and isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        out[target.id] = (node, *span(node))

    walk(tree.body, "")
    return out, None


def _changed_defs(
    old: dict[str, _Span], new: dict[str, _Span], hunks: list[tuple[int, int, int, int]]
) -> set[str]:
    """Names whose parsed form differs. Only what spans a changed line can differ (the rest
    is the same text, at most moved), so only that is dumped: big files stay cheap."""

    def near(defs: dict[str, _Span], side: int) -> set[str]:
        ranges = [(h[side], h[side] + max(h[side + 1], 1) - 1) for h in hunks]
        return {
            name
            for name, (_node, start, end) in defs.items()
            if any(start <= last and end >= first for first, last in ranges)
        }

    candidates = (old.keys() ^ new.keys()) | (
        near(old, 0) | near(new, 2) if hunks else old.keys() | new.keys()
    )
    changed = set()
    for name in candidates:
        before, after = old.get(name), new.get(name)
        if before is None or after is None or ast.dump(before[0]) != ast.dump(after[0]):
            changed.add(name)
    return changed


def body_statements(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    """A function's statements without its docstring."""
    body = list(node.body)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    return body


def body_lines(span: _Span, hunks: list[tuple[int, int, int, int]]) -> frozenset[int] | None:
    """The statements of a function's body (at the base) a diff touched, each by its first
    line (the line a line tracer records for it), or None when the change reaches its
    header: decorators, signature or docstring (then the whole function counts). A pure
    insertion touches the statements on both sides of it."""
    node, start, end = span
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    body = body_statements(node)
    if not body:
        return None
    first = body[0].lineno
    touched: set[int] = set()
    for old_start, old_count, _new_start, _new_count in hunks:
        if not old_count and start <= old_start <= end and old_start + 1 > end:
            return None  # added after the last statement: every path reaching the end runs it
        lines = range(old_start, old_start + old_count) if old_count else (old_start, old_start + 1)
        touched.update(n for n in lines if start <= n <= end)
    if not touched or min(touched) < first:
        return None
    owner: dict[int, tuple[int, int]] = {}  # line -> (first line, -span) of its innermost statement
    for statement in body:
        for inner in ast.walk(statement):
            if not isinstance(inner, ast.stmt):
                continue
            last = inner.end_lineno or inner.lineno
            key = (inner.lineno, -(last - inner.lineno))
            for n in range(inner.lineno, last + 1):
                owner[n] = max(owner.get(n, key), key)
    starts = {owner[n][0] for n in touched if n in owner}
    return frozenset(starts) if starts else None


def changed_symbols(path: str, old: bytes | None, new: bytes | None) -> set[str]:
    """The qualified defs of one Python file that differ between two versions (all of the
    parsable side's when the other does not parse), without a diff: what the backtest
    needs of many past commits at once."""
    old_defs, old_err = _defs(old, path)
    new_defs, new_err = _defs(new, path)
    if old_err or new_err:
        return set(old_defs) | set(new_defs)
    return _changed_defs(old_defs, new_defs, [])


def _ops_from_lines(change: FileChange) -> set[str]:
    ops: set[str] = set()
    lines = [f"+{line}" for line in change.added] + [f"-{line}" for line in change.removed]
    if change.path.endswith(OP_SCHEMA):
        ops |= {m[1] for line in lines if (m := _FUNC_LINE.match(line))}
    for line in lines:
        ops |= {m.rsplit(".", 1)[-1] for m in _OPINFO_LINE.findall(line)}
        ops |= set(_DECOMP.findall(line))
    return ops


def analyze(
    repo: Repo,
    base: str,
    head: str,
    exclude: set[str] | None = None,
    patterns: tuple[str, ...] = DEFAULT_PATTERNS,
) -> ChangeAnalysis:
    """Compare ``base`` and ``head``; ``exclude`` hides paths (select-eval hides test edits)."""
    base_sha, head_sha = repo.resolve(base), repo.resolve(head)
    exclude = exclude or set()
    status_text = repo.text(
        "diff", "--name-status", "-M", "-z", "--end-of-options", base_sha, head_sha
    )
    fields = [f for f in status_text.split("\0") if f]
    files: dict[str, FileChange] = {}
    i = 0
    while i < len(fields):
        status = fields[i]
        if status.startswith(("R", "C")):
            old, new = fields[i + 1], fields[i + 2]
            files[new] = FileChange(new, "R", old_path=old)
            i += 3
        else:
            files[fields[i + 1]] = FileChange(fields[i + 1], status[0])
            i += 2
    for path in list(files):
        if path in exclude:
            del files[path]
    analysis = ChangeAnalysis(base_sha, head_sha, list(files.values()), patterns=patterns)
    if len(files) > MAX_FILES:
        analysis.truncated = True
        analysis.parse_errors.append(
            f"{len(files)} files changed: more than {MAX_FILES}, so symbols were not compared"
        )
        return analysis
    changed_lines = 0
    for line in repo.text("diff", "--numstat", "-z", "--end-of-options", base_sha, head_sha).split(
        "\0"
    ):
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0] == "-" and parts[2] in files:
            files[parts[2]].binary = True
        elif len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit():
            changed_lines += int(parts[0]) + int(parts[1])
    if changed_lines > MAX_DIFF_LINES:
        analysis.truncated = True
        analysis.parse_errors.append(
            f"{changed_lines} lines changed: more than {MAX_DIFF_LINES}, so hunks and symbols "
            "were not read (paths only)"
        )
        return analysis
    diff = _parse_diff(
        repo.text(
            "diff", "-U0", "-M", "--no-color", "--end-of-options", base_sha, head_sha, "--", *files
        )
    )
    parsed_files = 0
    for path, change in files.items():
        parsed = diff.get(path) or (diff.get(change.old_path) if change.old_path else None)
        if parsed:
            change.hunks, change.added, change.removed = parsed.hunks, parsed.added, parsed.removed
            change.contexts = parsed.contexts
        analysis.ops |= _ops_from_lines(change)
        if not path.endswith(".py") or change.binary:
            continue
        parsed_files += 1
        if parsed_files > MAX_PARSED:
            if parsed_files == MAX_PARSED + 1:
                analysis.truncated = True
                analysis.parse_errors.append(
                    f"more than {MAX_PARSED} Python files changed: the symbols of the first "
                    f"{MAX_PARSED} were compared, the rest count by their paths and lines"
                )
            continue
        old_src = repo.show(base_sha, change.old_path or path) if change.status != "A" else None
        new_src = repo.show(head_sha, path) if change.status != "D" else None
        old_defs, old_err = _defs(old_src, path)
        new_defs, new_err = _defs(new_src, path)
        analysis.parse_errors += [e for e in (old_err, new_err) if e]
        changed = _changed_defs(old_defs, new_defs, change.hunks)
        if old_err or new_err:  # one side unparsable: every def on the other side near a hunk
            changed |= set(old_defs) | set(new_defs)
        for name in changed:
            analysis.symbols.add(f"{path}:{name}")
            analysis.names.add(name.rsplit(".", 1)[-1])
            if name in old_defs and name in new_defs and not (old_err or new_err):
                lines = body_lines(old_defs[name], change.hunks)
                if lines:
                    analysis.lines[f"{path}:{name}"] = lines
        if any(path.startswith(d) for d in _OP_SOURCE_DIRS):
            analysis.ops |= {n.rsplit(".", 1)[-1] for n in changed if not n.startswith("_")}
        if is_test_path(path, patterns):
            for name in changed:
                cls, _, func = name.rpartition(".")
                if not func.startswith("test"):
                    continue
                test = TestId(path, cls or None, func)
                if name not in old_defs:
                    analysis.tests_added.add(test)
                elif name not in new_defs:
                    analysis.tests_removed.add(test)
                else:
                    analysis.tests_modified.add(test)
    return analysis
