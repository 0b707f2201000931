"""Safe YAML reading that remembers where every key and value came from.

PyYAML's safe loader already refuses Python tags, but it neither reports the
position of a value after construction, nor rejects duplicate keys, nor guards
against alias bombs. We compose the node graph ourselves and build plain data
plus a position index, so every later validation error can name file:line:col.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from reuse_specs.errors import SourceLocation, SpecError, SpecErrors

PathKey = tuple[str | int, ...]

MAX_SPEC_BYTES = 4 * 1024 * 1024
"""Spec files are hand-edited; anything larger is a mistake, not a config."""

MAX_EXPANDED_NODES = 200_000
"""Upper bound on nodes after alias expansion (a billion-laughs guard)."""

MAX_DEPTH = 64
"""Nesting limit: a spec is about eight levels deep; thousands would exhaust the stack."""

_SAFE_SCALAR_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"


@dataclass
class YamlDocument:
    """Plain data from one YAML file plus where each part of it was written."""

    file: str
    data: Any
    value_marks: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    key_marks: dict[PathKey, tuple[int, int]] = field(default_factory=dict)

    def locate(self, path: PathKey) -> SourceLocation:
        """Position of the value at ``path``, or of its closest written ancestor."""
        for end in range(len(path), -1, -1):
            mark = self.value_marks.get(path[:end])
            if mark is not None:
                return SourceLocation(self.file, *mark)
        return SourceLocation(self.file, 1, 1)

    def locate_key(self, path: PathKey) -> SourceLocation:
        """Position of the mapping key that introduces ``path``."""
        mark = self.key_marks.get(path)
        return SourceLocation(self.file, *mark) if mark else self.locate(path)


_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc,valid-type]
    """Safe loader (libyaml's when present) used to compose nodes and build safe scalars."""


def _mark(node: Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _decode(raw: bytes, file: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecErrors(
            [
                SpecError(
                    SourceLocation(file, line, column),
                    f"file is not valid UTF-8 (byte 0x{raw[exc.start]:02x}); "
                    "spec files must be saved as UTF-8",
                )
            ]
        ) from None


def _check_expansion(root: Node, file: str) -> None:
    """Reject recursive aliases, alias graphs that expand past the limit, and nesting
    deeper than :data:`MAX_DEPTH` once aliases are expanded (before anything recurses over
    the data)."""
    seen: dict[int, tuple[int, int]] = {}  # node -> (expanded size, height below it)
    on_stack: set[int] = set()

    def too_deep(node: Node) -> SpecErrors:
        return SpecErrors(
            [
                SpecError(
                    SourceLocation(file, *_mark(node)),
                    f"nested deeper than {MAX_DEPTH} levels; a spec needs about eight",
                )
            ]
        )

    def measure(node: Node, depth: int) -> tuple[int, int]:
        if depth > MAX_DEPTH:
            raise too_deep(node)
        key = id(node)
        if key in seen:  # an alias: its subtree again, maybe deeper than where it was seen
            total, height = seen[key]
            if depth + height > MAX_DEPTH:
                raise too_deep(node)
            return total, height
        if key in on_stack:
            raise SpecErrors(
                [SpecError(SourceLocation(file, *_mark(node)), "recursive YAML alias")]
            )
        on_stack.add(key)
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        total, height = 1, 0
        for child in children:
            size, below = measure(child, depth + 1)
            total += size
            height = max(height, below + 1)
        on_stack.discard(key)
        if total > MAX_EXPANDED_NODES:
            raise SpecErrors(
                [
                    SpecError(
                        SourceLocation(file, *_mark(node)),
                        f"YAML anchors/aliases expand to more than {MAX_EXPANDED_NODES:,} "
                        "nodes (an alias bomb?); write the repeated part out or share less",
                    )
                ]
            )
        seen[key] = (total, height)
        return total, height

    measure(root, 0)


class _Builder:
    def __init__(self, loader: _Loader, doc: YamlDocument) -> None:
        self.loader = loader
        self.doc = doc
        self.errors: list[SpecError] = []

    def error(self, node: Node, message: str) -> None:
        self.errors.append(SpecError(SourceLocation(self.doc.file, *_mark(node)), message))

    def build(self, node: Node, path: PathKey) -> Any:
        self.doc.value_marks.setdefault(path, _mark(node))
        if isinstance(node, MappingNode):
            return self._mapping(node, path)
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ_TAG:
                self.error(node, f"YAML tag {node.tag!r} is not allowed (plain YAML only)")
                return None
            return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
        assert isinstance(node, ScalarNode)
        if node.tag not in _SAFE_SCALAR_TAGS:
            self.error(
                node,
                f"YAML tag {node.tag!r} is not allowed: spec files are plain data "
                "(strings, numbers, booleans, lists, mappings)",
            )
            return None
        try:
            return self.loader.construct_object(node, deep=True)
        except (ValueError, yaml.YAMLError):  # e.g. `!!int 0x1F oops` (found by fuzzing)
            self.error(node, f"cannot read {node.value!r:.60} as {node.tag.rsplit(':', 1)[-1]}")
            return None

    def _mapping(self, node: MappingNode, path: PathKey) -> dict[str, Any] | None:
        if node.tag != _MAP_TAG:
            self.error(node, f"YAML tag {node.tag!r} is not allowed (plain YAML only)")
            return None
        try:
            self.loader.flatten_mapping(node)  # resolves `<<: *anchor` merge keys
        except yaml.MarkedYAMLError as exc:
            self.error(node, str(exc.problem))
            return None
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                self.error(key_node, "mapping keys must be plain strings")
                continue
            key = str(key_node.value)
            if key in result:
                self.error(key_node, f"duplicate key {key!r} in the same mapping")
                continue
            self.doc.key_marks[(*path, key)] = _mark(key_node)
            result[key] = self.build(value_node, (*path, key))
        return result


def load_yaml(
    path: Path, display_name: str | None = None, expected: str = "the key 'test_suite_config'"
) -> YamlDocument:
    """Read one YAML file safely; raise :class:`SpecErrors` with positions (``expected``: what
    an empty file's error says the mapping should hold)."""
    file = display_name or str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecErrors([SpecError(SourceLocation(file, 1, 1), "no such file")]) from None
    except OSError as exc:
        raise SpecErrors(
            [SpecError(SourceLocation(file, 1, 1), f"cannot read: {exc.strerror}")]
        ) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecErrors(
            [
                SpecError(
                    SourceLocation(file, 1, 1),
                    f"file is {len(raw):,} bytes; spec files are limited to {MAX_SPEC_BYTES:,}",
                )
            ]
        )
    text = _decode(raw, file)
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = SourceLocation(file, mark.line + 1, mark.column + 1) if mark else None
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        raise SpecErrors(
            [SpecError(where or SourceLocation(file, 1, 1), f"invalid YAML: {what}")]
        ) from None
    except yaml.YAMLError as exc:
        raise SpecErrors([SpecError(SourceLocation(file, 1, 1), f"invalid YAML: {exc}")]) from None
    try:
        doc = YamlDocument(file=file, data=None)
        if root is None:
            raise SpecErrors(
                [
                    SpecError(
                        SourceLocation(file, 1, 1),
                        f"empty file: expected a mapping with {expected}",
                    )
                ]
            )
        _check_expansion(root, file)
        builder = _Builder(loader, doc)
        doc.data = builder.build(root, ())
        if builder.errors:
            raise SpecErrors(builder.errors)
        return doc
    finally:
        loader.dispose()
