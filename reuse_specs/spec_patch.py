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

EditKind = Literal[
    "rename_test", "remove_test", "rename_file", "remove_file", "add_test", "set_mode"
]
REMOVED = "# removed upstream: "


@dataclass(frozen=True)
class SpecEdit:
    """One change to a spec: ``path`` is the file entry's path as written, ``spec`` the
    spec file it is written in."""

    kind: EditKind
    path: str
    old: str  # the listed test name (test edits) or the path (file edits)
    new: str | None = None  # the new name or path; for add_test and set_mode, the mode
    reason: str = ""  # for add_test and set_mode, written as the mode line's comment
    spec: str = ""
    tags: tuple[str, ...] = ()  # add_test: the entry's tags


class PatchError(ValueError):
    pass


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    text: str


def mapping_value(mapping: MappingNode, key: str) -> Node | None:
    for key_node, value_node in mapping.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            found: Node = value_node
            return found
    return None


def quoted(node: ScalarNode, new: str) -> str:
    if node.style == "'":
        return "'" + new.replace("'", "''") + "'"
    if node.style == '"':
        return json.dumps(new)
    return new


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _marker(edit: SpecEdit | None) -> str:
    """What a commented-out line starts with: the edit's reason, else "removed upstream"."""
    reason = " ".join(edit.reason.split()).split(":")[0] if edit and edit.reason else ""
    return f"# {reason}: " if reason else REMOVED


def _comment_out(text: str, first: int, last: int, marker: str = REMOVED) -> list[Span]:
    """Insert the removal marker at the first non-blank column of lines ``first..last``
    (0-based), which keeps their text, comments included."""
    spans: list[Span] = []
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
        spans.append(Span(begin + indent, begin + indent, marker))
    return spans


def _last_line(node: Node) -> int:
    """The last line a node's own text is on (a block node's end mark sits where the next
    token starts, often on a later line, so the last value decides)."""
    if isinstance(node, MappingNode) and not node.flow_style and node.value:
        return _last_line(node.value[-1][1])
    if isinstance(node, SequenceNode) and not node.flow_style and node.value:
        return _last_line(node.value[-1])
    end = node.end_mark
    return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line


def _entry_lines(seq: SequenceNode, index: int) -> tuple[int, int]:
    """Lines of a block sequence's item, from its ``-`` line to its last line."""
    item = seq.value[index]
    return item.start_mark.line, _last_line(item)


def _drop_from_flow(seq: SequenceNode, index: int) -> Span:
    items = seq.value
    if index + 1 < len(items):
        return Span(items[index].start_mark.index, items[index + 1].start_mark.index, "")
    return Span(items[index - 1].end_mark.index, items[index].end_mark.index, "")


def patch_spec_text(text: str, edits: list[SpecEdit]) -> str:
    """``text`` with ``edits`` applied, or :class:`PatchError` when one does not apply."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise PatchError(f"the spec does not parse: {exc}") from None
    config = mapping_value(root, "test_suite_config") if isinstance(root, MappingNode) else None
    files = mapping_value(config, "files") if isinstance(config, MappingNode) else None
    if not isinstance(files, SequenceNode):
        raise PatchError("no test_suite_config.files list")
    spans: list[Span] = []
    done: set[SpecEdit] = set()
    for file_index, entry in enumerate(files.value):
        if not isinstance(entry, MappingNode):
            continue
        path_node = mapping_value(entry, "path")
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
                    Span(
                        path_node.start_mark.index,
                        path_node.end_mark.index,
                        quoted(path_node, edit.new),
                    )
                )
                done.add(edit)
        if any(e.kind == "remove_file" for e in mine):
            continue
        tests = mapping_value(entry, "tests")
        for edit in mine:
            if edit.kind == "add_test":
                spans.append(_add_test(text, entry, tests, edit))
                done.add(edit)
            elif edit.kind == "set_mode" and isinstance(tests, SequenceNode):
                span = _set_mode(text, tests, edit)
                if span is not None:
                    spans.append(span)
                    done.add(edit)
        if not isinstance(tests, SequenceNode):
            continue
        spans += _test_edits(
            text, tests, [e for e in mine if e.kind in ("rename_test", "remove_test")], done
        )
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
    return apply_spans(text, spans)


def _comment(reason: str) -> str:
    one_line = " ".join(reason.split())
    return f"  # {one_line[:160]}" if one_line else ""


def _add_test(text: str, entry: MappingNode, tests: Node | None, edit: SpecEdit) -> Span:
    """A new ``tests`` item after the last one (or a new ``tests`` key after the entry),
    indented like its neighbours, in block style."""

    def item(dash: int) -> str:
        pad = " " * dash
        lines = f"{pad}- names: [{edit.old}]\n"
        lines += f"{pad}  mode: {edit.new or 'mandatory_success'}{_comment(edit.reason)}\n"
        if edit.tags:
            lines += f"{pad}  tags: [{', '.join(edit.tags)}]\n"
        return lines

    if isinstance(tests, SequenceNode) and tests.value and not tests.flow_style:
        dash = tests.value[0].start_mark.column - 2  # block items: "- " before the mapping
        at = _line_end(text, _last_line(tests.value[-1]))
        return Span(at, at, item(dash))
    if tests is not None:
        raise PatchError(f"the tests of {edit.path!r} are not a block list; add {edit.old} by hand")
    key_column = entry.value[0][0].start_mark.column
    at = _line_end(text, _last_line(entry))
    return Span(at, at, f"{' ' * key_column}tests:\n" + item(key_column + 2))


def _line_end(text: str, line: int) -> int:
    """The index just after line ``line``'s newline (the end of the text if it has none)."""
    index = 0
    for _ in range(line + 1):
        found = text.find("\n", index)
        if found == -1:
            return len(text)
        index = found + 1
    return index


def _set_mode(text: str, tests: SequenceNode, edit: SpecEdit) -> Span | None:
    """The mode of the entry that lists only ``edit.old``: its ``mode`` value replaced (the
    reason as the line's comment when the line has none)."""
    for test in tests.value:
        names = _names_of(test)
        if names is None or [getattr(n, "value", None) for n in names.value] != [edit.old]:
            continue
        assert isinstance(test, MappingNode)
        mode = mapping_value(test, "mode")
        if isinstance(mode, ScalarNode):
            end = mode.end_mark.index
            rest = text[end : text.find("\n", end) if "\n" in text[end:] else len(text)]
            note = "" if "#" in rest else _comment(edit.reason)
            return Span(mode.start_mark.index, end, quoted(mode, edit.new or "") + note)
        return None  # no mode key: the caller adds an entry instead
    return None


def _names_of(test: Node) -> SequenceNode | None:
    if not isinstance(test, MappingNode):
        return None
    names = mapping_value(test, "names")
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
) -> list[Span]:
    spans: list[Span] = []
    seen: set[int] = set()  # an anchored list shared by aliases is edited once
    for test_index, test in enumerate(tests.value):
        names = _names_of(test)
        if names is None or id(names) in seen:
            continue
        seen.add(id(names))
        listed = [n.value if isinstance(n, ScalarNode) else None for n in names.value]
        removed = {
            i: e
            for i, value in enumerate(listed)
            for e in edits
            if e.kind == "remove_test" and e.old == value
        }
        done.update(e for e in edits if e.kind == "remove_test" and e.old in listed)
        if removed and len(removed) == len(listed):  # nothing left: the whole entry goes
            if tests.flow_style:
                spans.append(_drop_from_flow(tests, test_index))
            else:
                marker = _marker(next(iter(removed.values())))
                spans += _comment_out(text, *_entry_lines(tests, test_index), marker)
            continue
        for i, node in enumerate(names.value):
            if not isinstance(node, ScalarNode):
                continue
            if i in removed:
                if names.flow_style:
                    spans.append(_drop_from_flow(names, i))
                else:
                    line = node.start_mark.line
                    spans += _comment_out(text, line, line, _marker(removed[i]))
                continue
            for edit in edits:
                if edit.kind == "rename_test" and edit.old == node.value and edit.new:
                    spans.append(
                        Span(node.start_mark.index, node.end_mark.index, quoted(node, edit.new))
                    )
                    done.add(edit)
    return spans


def apply_spans(text: str, spans: list[Span]) -> str:
    unique = sorted(set(spans), key=lambda s: (s.start, s.end))
    for before, after in itertools.pairwise(unique):
        if after.start < before.end:
            raise PatchError("two edits overlap in the spec; edit it by hand")
    for span in reversed(unique):
        text = text[: span.start] + span.text + text[span.end :]
    return text
