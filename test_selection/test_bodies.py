"""Test functions of a file version, found by indentation instead of a parse.

The backtest needs, for hundreds of past commits, which existing test functions each one
edited: both versions of every test file it touched, split into functions and compared.
``ast`` costs about half a second per megabyte, which a cold selection cannot pay for a
history's worth of versions; regular expressions over the text find the same ``def test*``
blocks at C speed. The price is exactness in odd files (a column-0 line inside a
triple-quoted string ends the function early), which only blurs the backtest's labels.

Names follow the inventory's test ids: ``Class::test`` or ``test`` (nested classes joined
with ``::``); a ``def`` inside a function is not a test.
"""

from __future__ import annotations

import hashlib
import keyword
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

MAX_TOKEN_CHARS = 4000  # what the inventory keeps of a test's source: features read the same
AGENT_CHARS = 1500  # what the local agent embeds of a test
_BLOCK = re.compile(r"^([ \t]*)(?:async[ \t]+)?(def|class)[ \t]+(\w+)", re.M)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_END_CACHE: dict[int, re.Pattern[str]] = {}


def _end_pattern(indent: int) -> re.Pattern[str]:
    """A code line indented no deeper than ``indent``: where a block at that depth ends."""
    pattern = _END_CACHE.get(indent)
    if pattern is None:
        pattern = re.compile(rf"^[ \t]{{0,{indent}}}[^ \t\r\n#]", re.M)
        _END_CACHE[indent] = pattern
    return pattern


MAX_DIFF_CHARS = 200_000  # of a change's lines read for its words (a vendored drop says little)


_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


@lru_cache(maxsize=262144)
def _parts(identifier: str) -> tuple[str, ...]:
    """The words inside an identifier (``compute_loss``, ``computeLoss``: compute, loss)."""
    return tuple(
        {p.lower() for chunk in identifier.split("_") for p in _PART.findall(chunk) if len(p) > 2}
        - {identifier}
    )


def _with_parts(identifiers: Iterable[str]) -> frozenset[str]:
    """Identifiers and the words inside them: ``test_compute_loss_shape`` shares ``compute``
    and ``loss`` with a change to ``compute_loss`` (measured on five histories: edited tests
    come earlier in their file than with whole identifiers alone)."""
    out = set(identifiers)
    for identifier in list(out):
        out.update(_parts(identifier))
    return frozenset(out)


def tokens(text: str) -> frozenset[str]:
    """Identifiers of three characters or more and the words in them (what a test and a
    diff can share)."""
    return _with_parts(_IDENT.findall(text[:MAX_TOKEN_CHARS]))


def diff_words(lines: Iterable[str]) -> frozenset[str]:
    """The identifiers (and the words in them) of a change's added, removed and hunk-context
    lines."""
    words: set[str] = set()
    budget = MAX_DIFF_CHARS
    for line in lines:
        words.update(_IDENT.findall(line[:budget]))
        budget -= len(line)
        if budget <= 0:
            break
    return _with_parts(words)


def telling(words: Iterable[str]) -> list[str]:
    """The words worth showing a reader of why a test was chosen: Python's keywords (``def``,
    ``return``) are shared by every test and change, so a reason never names them."""
    return [w for w in words if not keyword.iskeyword(w)]


@dataclass(frozen=True)
class TestBody:
    """One test function of one file version."""

    __test__ = False

    name: str
    digest: str  # of its decorators and body: a change to either is an edit
    lines: int
    tokens: frozenset[str]
    head: str  # its first characters, what an agent reads of it


_HEADER_CHARS = re.compile(r"[()\[\]{}:]")


def _header_end(text: str, pos: int) -> int:
    """End of the line holding the ``:`` that closes a ``def`` header (which may span lines)."""
    depth = 0
    for match in _HEADER_CHARS.finditer(text, pos):
        char = match.group()
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth <= 0:
            break
    else:
        return len(text)
    end = text.find("\n", match.end())
    return len(text) if end < 0 else end


def _decorated_start(text: str, start: int, indent: str) -> int:
    """Move ``start`` (a ``def`` line) up over the decorators directly above it, multi-line
    ones included (their inner lines are deeper, their closing bracket at ``indent``)."""
    top = start
    pos = start
    while pos > 0:
        prev = text.rfind("\n", 0, pos - 1) + 1
        line = text[prev : pos - 1]
        if line.startswith(indent + "@"):
            top = prev
        elif not (line.startswith(indent + " ") or line.startswith(indent + "\t")) and not (
            line.startswith(indent) and line[len(indent) : len(indent) + 1] in (")", "]")
        ):
            break
        pos = prev
    return top


@lru_cache(maxsize=4096)
def split_tests(text: str) -> dict[str, TestBody]:
    """Every test function of a file version by name (see the module docstring)."""
    out: dict[str, TestBody] = {}
    stack: list[tuple[int, str, str]] = []  # (indent, kind, name) of the open blocks
    for match in _BLOCK.finditer(text):
        indent, kind, name = match.group(1), match.group(2), match.group(3)
        depth = len(indent.expandtabs(4))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        inside_function = any(k == "def" for _, k, _ in stack)
        classes = [n for _, k, n in stack if k == "class"]
        stack.append((depth, kind, name))
        if kind != "def" or inside_function or not name.startswith("test"):
            continue
        line_end = _header_end(text, match.end())
        end_match = _end_pattern(len(indent)).search(text, line_end + 1)
        end = end_match.start() if end_match else len(text)
        body = text[_decorated_start(text, match.start(), indent) : end].rstrip()
        # trailing comment lines belong to whatever follows
        lines = body.split("\n")
        while len(lines) > 1 and lines[-1].strip().startswith("#"):
            lines.pop()
        body = "\n".join(line.rstrip() for line in lines)
        qualified = "::".join([*classes, name])
        out[qualified] = TestBody(
            qualified,
            hashlib.blake2b(body.encode("utf-8", "replace"), digest_size=12).hexdigest(),
            len(lines),
            tokens(body),
            body[:AGENT_CHARS],
        )
    return out


def edited_tests(before: str, after: str) -> set[str]:
    """Tests present in both versions whose decorators or body differ."""
    old, new = split_tests(before), split_tests(after)
    return {name for name, body in old.items() if name in new and new[name].digest != body.digest}
