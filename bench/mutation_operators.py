"""How ``bench/mutation_lib.py`` breaks a function: a small edit of its source, made with
``ast`` positions so the rest of the file is untouched, and which functions are worth
breaking.

Operators (each changes behaviour when the function runs):

- ``raise``: ``raise RuntimeError`` before the body's first statement;
- ``return``: a ``return VALUE`` (chosen by the seed) returns the value with one element wrong
  (``__mutation_perturb__``, supplied by the plugin: a tensor or array with its first element
  changed, a graph without its last node, a number plus one, a bool negated, a sequence, set or
  dict without one item, an iterator without its first item);
- ``swap-args``: the first two positional arguments of a call (chosen by the seed) swapped;
- ``off-by-one``: an integer constant plus one, or a comparison's bound moved (``<`` to
  ``<=``, ``>`` to ``>=`` and back);
- ``drop-keyword``: a keyword argument of a call removed.
"""

from __future__ import annotations

import ast
import random
import textwrap
from dataclasses import dataclass

from test_selection.change_analysis import body_statements

OPERATORS = ("raise", "return", "swap-args", "off-by-one", "drop-keyword")
PERTURB = "__mutation_perturb__"


@dataclass
class Edit:
    """Replace the text between two ``(line, column)`` positions (1-based lines)."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str

    def apply(self, source: str) -> str:
        return source[: offset(source, self.start)] + self.text + source[offset(source, self.end) :]


def offset(source: str, pos: tuple[int, int]) -> int:
    """The string index of an ``ast`` position (1-based line, UTF-8 byte column)."""
    lines = source.splitlines(keepends=True)
    before = sum(len(line) for line in lines[: pos[0] - 1])
    line = lines[pos[0] - 1] if 0 < pos[0] <= len(lines) else ""
    return before + len(line.encode()[: pos[1]].decode(errors="ignore"))


def _function_nodes(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Module-level functions and the methods of module-level classes, by qualified name."""
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    out[f"{node.name}.{sub.name}"] = sub
    return out


def _trivial(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = body_statements(node)
    if not body:
        return True
    if len(body) == 1:
        only = body[0]
        if isinstance(only, ast.Pass):
            return True
        if isinstance(only, ast.Expr) and isinstance(only.value, ast.Constant):
            return True  # ``...``
        if isinstance(only, ast.Raise):
            return True
    return False


def functions(text: str) -> list[str]:
    """Qualified names of the functions of ``text`` worth mutating (not trivial, not
    properties, the body on its own lines)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out = []
    for name, node in _function_nodes(tree).items():
        decorators = {ast.unparse(d) for d in node.decorator_list}
        if decorators & {"property", "overload", "typing.overload", "abstractmethod"}:
            continue
        if any(d.endswith((".setter", ".getter", ".deleter")) for d in decorators):
            continue
        if _trivial(node) or body_statements(node)[0].lineno == node.lineno:
            continue
        out.append(name)
    return out


def _inner(node: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body (not its signature or decorators), in source order."""
    found: list[ast.AST] = []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        for stmt in body_statements(node):
            found.extend(ast.walk(stmt))
    found.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
    return found


def _segment(text: str, node: ast.AST) -> str:
    got = ast.get_source_segment(text, node)
    return got if got is not None else ast.unparse(node)


def _span(node: ast.AST) -> tuple[tuple[int, int], tuple[int, int]]:
    end_line = node.end_lineno if node.end_lineno is not None else node.lineno  # type: ignore[attr-defined]
    end_col = node.end_col_offset if node.end_col_offset is not None else 0  # type: ignore[attr-defined]
    return (node.lineno, node.col_offset), (end_line, end_col)  # type: ignore[attr-defined]


_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}


def _candidates(text: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, operator: str) -> list[Edit]:
    """Every edit ``operator`` can make in ``fn`` (positions in ``text``'s coordinates)."""
    nodes = _inner(fn)
    edits: list[Edit] = []
    if operator == "raise":
        first = body_statements(fn)[0]
        indent = " " * first.col_offset
        message = f"mutant: {fn.name} raises"
        edits.append(
            Edit(
                (first.lineno, 0),
                (first.lineno, 0),
                f"{indent}raise RuntimeError({message!r})\n",
            )
        )
    elif operator == "return":
        for node in nodes:
            if (
                isinstance(node, ast.Return)
                and node.value is not None
                and not (isinstance(node.value, ast.Constant) and node.value.value is None)
            ):
                start, end = _span(node.value)
                value = _segment(text, node.value)
                if isinstance(node.value, ast.Tuple) and not value.startswith("("):
                    value = f"({value})"  # ``return a, b``
                edits.append(Edit(start, end, f"{PERTURB}({value})"))
    elif operator == "swap-args":
        for node in nodes:
            if isinstance(node, ast.Call) and len(node.args) >= 2:
                a, b = node.args[0], node.args[1]
                if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
                    continue
                sa, sb = _segment(text, a), _segment(text, b)
                if sa == sb:
                    continue
                start, a_end = _span(a)
                b_start, end = _span(b)
                edits.append(Edit(start, end, sb + _between(text, a_end, b_start) + sa))
    elif operator == "off-by-one":
        for node in nodes:
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, int)
                and not isinstance(node.value, bool)
            ):
                start, end = _span(node)
                edits.append(Edit(start, end, str(node.value + 1)))
            elif isinstance(node, ast.Compare) and any(type(op) in _FLIP for op in node.ops):
                flipped = ast.Compare(
                    left=node.left,
                    ops=[_FLIP[type(op)]() if type(op) in _FLIP else op for op in node.ops],
                    comparators=node.comparators,
                )
                start, end = _span(node)
                edits.append(Edit(start, end, ast.unparse(flipped)))
    elif operator == "drop-keyword":
        for node in nodes:
            if isinstance(node, ast.Call):
                for i, kw in enumerate(node.keywords):
                    if kw.arg is None:
                        continue
                    call = ast.Call(
                        func=node.func,
                        args=node.args,
                        keywords=[k for j, k in enumerate(node.keywords) if j != i],
                    )
                    start, end = _span(node)
                    edits.append(Edit(start, end, ast.unparse(call)))
    else:
        raise ValueError(f"unknown operator {operator!r} (one of {', '.join(OPERATORS)})")
    return edits


def _between(text: str, start: tuple[int, int], end: tuple[int, int]) -> str:
    return text[offset(text, start) : offset(text, end)]


def mutate_text(text: str, qualname: str, operator: str, rng: random.Random) -> tuple[str, str]:
    """``text`` with ``qualname`` broken by ``operator`` (one of its possible edits, chosen
    by ``rng``) and a description of the edit; ValueError when the operator has nothing to
    change there."""
    tree = ast.parse(text)
    node = _function_nodes(tree).get(qualname)
    if node is None:
        raise ValueError(f"no function {qualname}")
    edits = _candidates(text, node, operator)
    if not edits:
        raise ValueError(f"{operator}: nothing to change in {qualname}")
    edit = edits[rng.randrange(len(edits))]
    mutated = edit.apply(text)
    ast.parse(mutated)  # still Python
    before = _between(text, edit.start, edit.end) if edit.start != edit.end else ""
    line = edit.start[0]
    what = f"line {line}: {before.strip()[:60]!r} -> {edit.text.strip()[:60]!r}"
    return mutated, what


def function_source(text: str, qualname: str) -> tuple[str, int]:
    """The def of ``qualname`` (without its decorators), dedented, and its first line."""
    node = _function_nodes(ast.parse(text)).get(qualname)
    if node is None:
        raise ValueError(f"no function {qualname}")
    lines = text.splitlines(keepends=True)
    end = node.end_lineno or node.lineno
    return textwrap.dedent("".join(lines[node.lineno - 1 : end])), node.lineno
