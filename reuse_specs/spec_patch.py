"""Edit a spec file in place of a person: rename or drop listed tests and files.

A maintainer's spec carries comments, anchors, key order, quoting and indentation that a
re-dump would lose (PyYAML drops comments; even round-trip libraries re-indent and move
comment columns). So nothing is re-dumped: the YAML parser reports the exact character span
of every value, and each edit replaces one span. A renamed test keeps its quoting; a dropped
block-list item, test entry or file entry is commented out (its comment text kept, after a
``# removed upstream:`` marker) rather than deleted; a dropped flow-list item is cut with its
comma. Everything else stays byte for byte.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Literal

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

EditKind = Literal["rename_test", "remove_test", "rename_file", "remove_file"]
REMOVED = "# removed upstream: "


@dataclass(frozen=True)
class SpecEdit:
    """One change to a spec: ``path`` is the file entry's path as written, ``spec`` the
    spec file it is written in."""

    kind: EditKind
    path: str
    old: str  # the listed test name (test edits) or the path (file edits)
    new: str | None = None
    reason: str = ""
    spec: str = ""


class PatchError(ValueError):
    pass


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    text: str


def _value(mapping: MappingNode, key: str) -> Node | None:
    for key_node, value_node in mapping.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            found: Node = value_node
            return found
    return None


def _quoted(node: ScalarNode, new: str) -> str:
    if node.style == "'":
        return "'" + new.replace("'", "''") + "'"
    if node.style == '"':
        return json.dumps(new)
    return new


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _comment_out(text: str, first: int, last: int) -> list[_Span]:
    """Insert the removal marker at the first non-blank column of lines ``first..last``
    (0-based), which keeps their text, comments included."""
    spans: list[_Span] = []
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    for line in range(first, last + 1):
        if line >= len(starts):
            break
        begin = starts[line]
        stop = text.find("\n", begin)
        content = text[begin : stop if stop != -1 else len(text)]
        if not content.strip() or content.lstrip().startswith("#"):
            continue
        indent = len(content) - len(content.lstrip())
        spans.append(_Span(begin + indent, begin + indent, REMOVED))
    return spans


def _last_line(node: Node) -> int:
    """The last line a block node occupies (its end mark sits at the next line's start)."""
    end = node.end_mark
    return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line


def _entry_lines(seq: SequenceNode, index: int) -> tuple[int, int]:
    """Lines of a block sequence's item, from its ``-`` line to its last line."""
    item = seq.value[index]
    return item.start_mark.line, _last_line(item)


def _drop_from_flow(seq: SequenceNode, index: int) -> _Span:
    items = seq.value
    if index + 1 < len(items):
        return _Span(items[index].start_mark.index, items[index + 1].start_mark.index, "")
    return _Span(items[index - 1].end_mark.index, items[index].end_mark.index, "")


def patch_spec_text(text: str, edits: list[SpecEdit]) -> str:
    """``text`` with ``edits`` applied, or :class:`PatchError` when one does not apply."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise PatchError(f"the spec does not parse: {exc}") from None
    config = _value(root, "test_suite_config") if isinstance(root, MappingNode) else None
    files = _value(config, "files") if isinstance(config, MappingNode) else None
    if not isinstance(files, SequenceNode):
        raise PatchError("no test_suite_config.files list")
    spans: list[_Span] = []
    done: set[SpecEdit] = set()
    for file_index, entry in enumerate(files.value):
        if not isinstance(entry, MappingNode):
            continue
        path_node = _value(entry, "path")
        if not isinstance(path_node, ScalarNode):
            continue
        mine = [e for e in edits if e.path == path_node.value]
        if not mine:
            continue
        for edit in mine:
            if edit.kind == "remove_file":
                spans += _comment_out(text, *_entry_lines(files, file_index))
                done.add(edit)
            elif edit.kind == "rename_file" and edit.new is not None:
                spans.append(
                    _Span(
                        path_node.start_mark.index,
                        path_node.end_mark.index,
                        _quoted(path_node, edit.new),
                    )
                )
                done.add(edit)
        if any(e.kind == "remove_file" for e in mine):
            continue
        tests = _value(entry, "tests")
        if not isinstance(tests, SequenceNode):
            continue
        spans += _test_edits(text, tests, [e for e in mine if e.kind.endswith("_test")], done)
        test_edits = [e for e in mine if e.kind == "remove_test"]
        if test_edits and _every_entry_dropped(tests, test_edits):
            key_line = next(
                k.start_mark.line
                for k, v in entry.value
                if isinstance(k, ScalarNode) and v is tests
            )
            spans += _comment_out(text, key_line, key_line)
    missing = [e for e in edits if e not in done]
    if missing:
        raise PatchError(
            "no such entry in the spec: "
            + "; ".join(f"{e.kind} {e.old!r} under {e.path!r}" for e in missing)
        )
    return _apply(text, spans)


def _names_of(test: Node) -> SequenceNode | None:
    if not isinstance(test, MappingNode):
        return None
    names = _value(test, "names")
    return names if isinstance(names, SequenceNode) else None


def _every_entry_dropped(tests: SequenceNode, removals: list[SpecEdit]) -> bool:
    gone = {e.old for e in removals}
    for test in tests.value:
        names = _names_of(test)
        if names is None or any(
            not (isinstance(n, ScalarNode) and n.value in gone) for n in names.value
        ):
            return False
    return True


def _test_edits(
    text: str, tests: SequenceNode, edits: list[SpecEdit], done: set[SpecEdit]
) -> list[_Span]:
    spans: list[_Span] = []
    seen: set[int] = set()  # an anchored list shared by aliases is edited once
    for test_index, test in enumerate(tests.value):
        names = _names_of(test)
        if names is None or id(names) in seen:
            continue
        seen.add(id(names))
        listed = [n.value if isinstance(n, ScalarNode) else None for n in names.value]
        removed = {
            i
            for i, value in enumerate(listed)
            for e in edits
            if e.kind == "remove_test" and e.old == value
        }
        done.update(e for e in edits if e.kind == "remove_test" and e.old in listed)
        if removed and len(removed) == len(listed):  # nothing left: the whole entry goes
            if tests.flow_style:
                spans.append(_drop_from_flow(tests, test_index))
            else:
                spans += _comment_out(text, *_entry_lines(tests, test_index))
            continue
        for i, node in enumerate(names.value):
            if not isinstance(node, ScalarNode):
                continue
            if i in removed:
                if names.flow_style:
                    spans.append(_drop_from_flow(names, i))
                else:
                    line = node.start_mark.line
                    spans += _comment_out(text, line, line)
                continue
            for edit in edits:
                if edit.kind == "rename_test" and edit.old == node.value and edit.new:
                    spans.append(
                        _Span(node.start_mark.index, node.end_mark.index, _quoted(node, edit.new))
                    )
                    done.add(edit)
    return spans


def _apply(text: str, spans: list[_Span]) -> str:
    unique = sorted(set(spans), key=lambda s: (s.start, s.end))
    for before, after in itertools.pairwise(unique):
        if after.start < before.end:
            raise PatchError("two edits overlap in the spec; edit it by hand")
    for span in reversed(unique):
        text = text[: span.start] + span.text + text[span.end :]
    return text
