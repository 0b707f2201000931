"""torch-spyre's tier ladder: which spec labels a run of one label takes, the old tier names,
and the check its ``make check-all-configs`` makes first.

Facts (from the project's design notes, its record of torch-spyre's format; no code of
theirs): since torch-spyre PR #3675 (2026-08-11) the tiers are, lowest first, smoke, unit,
integration, regression and trunk, read by its ``.github/scripts/resolve_covered_tiers.py``
from ``TORCH_SPYRE_TEST_TYPE``; the tiers ``core``, ``device_critical`` and ``full`` were
renamed ``unit``, ``integration`` and ``regression``; a config without labels fails "CHECK 0:
Labels" instead of counting as ``full``. Our reading of the resolver's name: a run of one
tier covers that tier and every tier below it (a regression run runs the smoke tests too).
torch-spyre's repository is kept for independent evaluation, so the resolver itself was not
read; a label outside the ladder (a team's own, such as ``nightly``) selects only itself.

``rename_old_labels`` rewrites the old names in a spec's text in place, value by value, as
``spec_patch`` edits specs: comments, quoting and layout stay.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from reuse_specs.spec_patch import PatchError, Span, apply_spans, mapping_value, quoted

LADDER = ("smoke", "unit", "integration", "regression", "trunk")
RENAMED = {"core": "unit", "device_critical": "integration", "full": "regression"}
RENAMED_IN = "torch-spyre PR #3675"


def current(label: str) -> str:
    """A label under its name since the rename (an old tier name -> its new one)."""
    return RENAMED.get(label, label)


def covered(label: str) -> frozenset[str]:
    """The labels a run of ``label`` takes: for a tier, it and every tier below it, each under
    its old name too; for any other label, itself."""
    name = current(label)
    if name not in LADDER:
        return frozenset({label})
    rungs = set(LADDER[: LADDER.index(name) + 1])
    return frozenset(rungs | {old for old, new in RENAMED.items() if new in rungs})


def selects(label: str, labels: Iterable[str]) -> bool:
    """Whether a run of ``label`` takes an entry labelled ``labels``."""
    return not covered(label).isdisjoint(labels)


def unknown_label(label: str, used: Iterable[str]) -> str | None:
    """Why ``--label`` cannot select anything, or None when it can: a label in no ladder
    that no spec carries would skip every test, silently."""
    if current(label) in LADDER or label in set(used):
        return None
    return (
        f"label {label!r} is not a tier ({', '.join(LADDER)}; the old names "
        f"{', '.join(RENAMED)} still read as theirs) and no spec entry carries it: every test "
        "would be skipped"
    )


@dataclass(frozen=True)
class LabelNote:
    """One thing ``specs check`` says about a spec's labels."""

    line: int  # 1-based; 0: the file as a whole
    text: str
    kind: str  # "old-name" | "no-ladder" | "no-labels"


def _label_lists(root: Node) -> Iterator[SequenceNode]:
    """Every ``labels`` list of a spec: the suite's, each file entry's, each test entry's."""
    config = mapping_value(root, "test_suite_config") if isinstance(root, MappingNode) else None
    if not isinstance(config, MappingNode):
        return
    found = mapping_value(config, "labels")
    if isinstance(found, SequenceNode):
        yield found
    files = mapping_value(config, "files")
    for entry in files.value if isinstance(files, SequenceNode) else ():
        if not isinstance(entry, MappingNode):
            continue
        found = mapping_value(entry, "labels")
        if isinstance(found, SequenceNode):
            yield found
        tests = mapping_value(entry, "tests")
        for test in tests.value if isinstance(tests, SequenceNode) else ():
            found = mapping_value(test, "labels") if isinstance(test, MappingNode) else None
            if isinstance(found, SequenceNode):
                yield found


def _labels(text: str) -> list[ScalarNode]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []  # the loader reports what does not parse
    if root is None:
        return []
    return [n for seq in _label_lists(root) for n in seq.value if isinstance(n, ScalarNode)]


def labels_in(text: str) -> set[str]:
    """Every label a spec's text gives (suite, file entries, test entries)."""
    return {node.value for node in _labels(text)}


def label_notes(text: str) -> list[LabelNote]:
    """What torch-spyre's ladder says of a spec's labels: each old tier name with its new
    one, each label in no ladder, and a config with no label anywhere (its CHECK 0)."""
    nodes = _labels(text)
    notes = []
    for node in nodes:
        line = node.start_mark.line + 1
        if node.value in RENAMED:
            notes.append(
                LabelNote(
                    line,
                    f"label {node.value!r} is the old name of tier {RENAMED[node.value]!r} "
                    f"(renamed in {RENAMED_IN}); `ci-relay specs fix-labels` rewrites it",
                    "old-name",
                )
            )
        elif node.value not in LADDER:
            notes.append(
                LabelNote(
                    line,
                    f"label {node.value!r} is in no tier ladder ({', '.join(LADDER)}): "
                    "only a run of that very label takes it",
                    "no-ladder",
                )
            )
    if not nodes:
        notes.append(
            LabelNote(
                0,
                "CHECK 0: Labels: the config has no labels; torch-spyre's check-all-configs "
                f"fails it since {RENAMED_IN} (before, it counted as 'full'); give it a tier: "
                + ", ".join(LADDER),
                "no-labels",
            )
        )
    return notes


def rename_old_labels(text: str) -> tuple[str, list[tuple[int, str, str]]]:
    """The spec's text with each old tier name replaced by its new one, value by value
    (quoting, comments and layout kept), and what changed: (line, old, new)."""
    spans, done = [], []
    for node in _labels(text):
        new = RENAMED.get(node.value)
        if new is None:
            continue
        spans.append(Span(node.start_mark.index, node.end_mark.index, quoted(node, new)))
        done.append((node.start_mark.line + 1, node.value, new))
    try:
        return apply_spans(text, spans), done
    except PatchError:  # two labels cannot overlap; a spec that makes them is not one
        return text, []
