"""A release upgrade for reuse specs: which tests changed between two upstream revisions,
what that does to the specs, and the spec edits that follow.

The specs are loaded against each revision's tree (exported from git into a scratch folder:
the user's checkout is never touched), so paths and globs resolve as a run there would see
them. The test-level diff is :mod:`test_selection.upgrade.release_diff`; the edits are applied
to the spec text by :mod:`reuse_specs.spec_patch` and the result is checked against the new
revision before anyone may write it.
"""

from __future__ import annotations

import difflib
import io
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from reuse_specs.errors import SourceLocation, SpecErrors
from reuse_specs.loader import FileRules, LoadedSpec, load_specs
from reuse_specs.matching import TestVariant, find_rule
from reuse_specs.spec_patch import PatchError, SpecEdit, patch_spec_text
from reuse_specs.upstream_check import SpecDrift, find_drift
from test_selection.git import GitError, Repo
from test_selection.types import TestId
from test_selection.upgrade.release_diff import ReleaseDiff, diff_release

MAX_COMMITS = 1_000_000  # a range is two trees compared, not commits walked; this is a typo guard


class UpgradeError(RuntimeError):
    """The upgrade cannot be planned: an unknown revision, a spec that does not load."""


@dataclass(frozen=True)
class NewTest:
    """A test that appeared in a reused file and no spec entry names: it follows the file's
    ``unlisted_test_mode``."""

    test: str
    mode: str
    spec: str


@dataclass
class SpecImpact:
    drift: list[SpecDrift] = field(default_factory=list)  # listed at B's tree but missing
    edits: list[SpecEdit] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)  # drift no edit can fix
    new_tests: list[NewTest] = field(default_factory=list)
    ops_vanished_but_listed: list[str] = field(default_factory=list)


@dataclass
class SpecPatch:
    """One spec file before and after the proposed edits."""

    path: Path
    before: str
    after: str

    def unified_diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.before.splitlines(keepends=True),
                self.after.splitlines(keepends=True),
                f"a/{self.path.name}",
                f"b/{self.path.name}",
            )
        )


@dataclass
class UpgradePlan:
    diff: ReleaseDiff
    impact: SpecImpact
    patches: list[SpecPatch]
    patch_problems: list[str] = field(default_factory=list)  # why the patch is not offered

    def unified_diff(self) -> str:
        return "".join(p.unified_diff() for p in self.patches if p.before != p.after)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.diff.to_json(),
            "run_list": self.diff.run_list(),
            "spec_impact": {
                "drift": [d.to_json() for d in self.impact.drift],
                "edits": [
                    {"kind": e.kind, "path": e.path, "old": e.old, "new": e.new, "reason": e.reason}
                    for e in self.impact.edits
                ],
                "unresolved": self.impact.unresolved,
                "new_tests": [
                    {"test": t.test, "mode": t.mode, "spec": t.spec} for t in self.impact.new_tests
                ],
                "ops_vanished_but_listed": self.impact.ops_vanished_but_listed,
            },
            "patch": self.unified_diff(),
            "patch_problems": self.patch_problems,
        }


@contextmanager
def exported_tree(repo: Repo, rev: str) -> Iterator[Path]:
    """The files of ``rev`` in a scratch folder (``git archive``, safely unpacked)."""
    data = repo.run("archive", "--format=tar", "--end-of-options", rev)
    with tempfile.TemporaryDirectory(prefix="ci-relay-upgrade-") as scratch:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            archive.extractall(scratch, filter="data")
        yield Path(scratch)


def _load(specs: list[Path], tree: Path, backend: str, side: str) -> LoadedSpec:
    try:
        return load_specs(specs, tree, backend)
    except SpecErrors as exc:
        raise UpgradeError(f"the specs do not load against {side}:\n{exc}") from None


def _relative(spec: LoadedSpec, tree: Path) -> list[str]:
    return [p.relative_to(tree).as_posix() for p in spec.test_files()]


def _listed(entry: FileRules, test: TestId) -> bool:
    return find_rule(entry, TestVariant(Path(test.file), test.cls, test.name)) is not None


def _name_for(listed: str, new_id: TestId) -> str:
    """The new name written the way the spec wrote the old one (with or without class)."""
    return f"{new_id.cls}::{new_id.name}" if "::" in listed and new_id.cls else new_id.name


def _impact(
    spec_b: LoadedSpec, tree_b: Path, diff: ReleaseDiff, renamed_files: dict[str, str]
) -> SpecImpact:
    impact = SpecImpact(drift=find_drift(spec_b))
    renames = {TestId.parse(old): TestId.parse(new) for old, new in diff.renames().items()}
    removed = {TestId.parse(c.test) for c in diff.changes if c.kind == "removed"}
    written_at: dict[SourceLocation, FileRules] = {}
    for file_rules in spec_b.files:
        written_at[file_rules.location] = file_rules
        written_at.update({p.location: file_rules for r in file_rules.rules for p in r.names})
    for drift in impact.drift:
        owner = written_at.get(drift.location)
        edit = None
        if owner is not None and drift.kind == "file":
            edit = _file_edit(owner, renamed_files, drift)
        elif owner is not None and drift.kind == "name":
            edit = _test_edit(owner, tree_b, drift, renames, removed)
        if owner is None or edit is None:
            impact.unresolved.append(str(drift))
        else:
            impact.edits.append(replace(edit, spec=owner.source))
    added = [TestId.parse(c.test) for c in diff.changes if c.kind == "added"]
    for entry in spec_b.files:
        files = {p.relative_to(tree_b).as_posix() for p in entry.resolved}
        for test in added:
            if test.file in files and not _listed(entry, test):
                impact.new_tests.append(
                    NewTest(test.nodeid, str(entry.unlisted_test_mode), entry.source)
                )
        listed_ops = {o.name for o in entry.global_config.supported_ops or ()}
        impact.ops_vanished_but_listed += sorted(listed_ops & set(diff.ops_removed))
    impact.ops_vanished_but_listed = sorted(set(impact.ops_vanished_but_listed))
    return impact


def _file_edit(
    entry: FileRules, renamed_files: dict[str, str], drift: SpecDrift
) -> SpecEdit | None:
    if entry.is_glob:
        return None
    raw = entry.raw_path
    prefix = "${TORCH_ROOT}/"
    relative = raw[len(prefix) :] if raw.startswith(prefix) else None
    if relative is not None and relative in renamed_files:
        new = prefix + renamed_files[relative]
        return SpecEdit("rename_file", raw, raw, new, f"git sees {relative} renamed")
    if drift.likely:
        return SpecEdit("rename_file", raw, raw, drift.likely, "closest file name in its folder")
    return SpecEdit("remove_file", raw, raw, None, "the file is gone and no rename was found")


def _test_edit(
    entry: FileRules,
    tree_b: Path,
    drift: SpecDrift,
    renames: dict[TestId, TestId],
    removed: set[TestId],
) -> SpecEdit | None:
    listed = drift.listed
    if any(ch in listed for ch in "*?["):
        return None  # a glob that matches nothing: a person decides what it should match
    cls = listed.split("::")[0] if "::" in listed else None
    name = listed.split("::")[-1]
    for path in entry.resolved:
        rel = path.relative_to(tree_b).as_posix()
        old = TestId(rel, cls, name)
        new = renames.get(old)
        if new is not None and new.file == rel:
            return SpecEdit(
                "rename_test",
                entry.raw_path,
                listed,
                _name_for(listed, new),
                "same body under the new name",
            )
        if new is not None:
            return SpecEdit(
                "remove_test",
                entry.raw_path,
                listed,
                None,
                f"moved to {new.nodeid}: list it under that file",
            )
        if old in removed:
            return SpecEdit("remove_test", entry.raw_path, listed, None, "removed upstream")
    if drift.likely:
        return SpecEdit("rename_test", entry.raw_path, listed, drift.likely, "closest name")
    return SpecEdit("remove_test", entry.raw_path, listed, None, "not at B, no rename found")


def _patches(
    specs: list[Path], impact: SpecImpact, tree_b: Path, backend: str
) -> tuple[list[SpecPatch], list[str]]:
    """Each spec with the edits applied, and what stops the patch from being offered."""
    patches: list[SpecPatch] = []
    problems: list[str] = []
    for spec in specs:
        before = spec.read_text(encoding="utf-8")
        mine = [e for e in impact.edits if e.spec == str(spec)]
        try:
            after = patch_spec_text(before, mine) if mine else before
        except PatchError as exc:
            problems.append(f"{spec}: {exc}")
            after = before
        patches.append(SpecPatch(spec, before, after))
    if any(p.before != p.after for p in patches) and not problems:
        problems += verify_patches(patches, tree_b, backend)
    return patches, problems


def verify_patches(patches: list[SpecPatch], tree_b: Path, backend: str) -> list[str]:
    """Load the patched specs (beside the originals, so ``${SPEC_DIR}`` means the same)
    against B's tree: they must load and list nothing B lacks."""
    written: list[Path] = []
    try:
        for patch in patches:
            shadow = patch.path.with_name(f".{patch.path.name}.upgrade-check.yaml")
            shadow.write_text(patch.after, encoding="utf-8")
            written.append(shadow)
        try:
            drift = find_drift(load_specs(written, tree_b, backend))
        except SpecErrors as exc:
            return [f"the patched spec does not load at B: {exc}"]
        return [f"the patched spec still drifts at B: {d}" for d in drift]
    finally:
        for path in written:
            path.unlink(missing_ok=True)


def plan_upgrade(
    upstream: Path, base: str, head: str, specs: list[Path], backend: str = "cpu"
) -> UpgradePlan:
    """Everything ``ci-relay upgrade`` reports, for ``specs`` moving from ``base`` to
    ``head`` of the git repository ``upstream``."""
    repo = Repo(upstream)
    try:
        base_sha, head_sha = repo.resolve(base), repo.resolve(head)
        count = int(repo.text("rev-list", "--count", f"{base_sha}..{head_sha}").strip() or 0)
    except GitError as exc:
        raise UpgradeError(str(exc)) from None
    if count > MAX_COMMITS:
        raise UpgradeError(f"{count:,} commits between the revisions: is the range right?")
    specs = [p.resolve() for p in specs]
    with exported_tree(repo, base_sha) as tree_a, exported_tree(repo, head_sha) as tree_b:
        spec_a = _load(specs, tree_a, backend, f"A ({base})")
        spec_b = _load(specs, tree_b, backend, f"B ({head})")
        renamed = _renamed_files(repo, base_sha, head_sha)
        files_a = _relative(spec_a, tree_a)
        files_b = _relative(spec_b, tree_b)
        # a file the specs list under its old name is still compared, under its new one
        files_b += [renamed[f] for f in files_a if f in renamed and renamed[f] not in files_b]
        diff = diff_release(repo, base_sha, head_sha, files_a, files_b)
        impact = _impact(spec_b, tree_b, diff, renamed)
        patches, problems = _patches(specs, impact, tree_b, backend)
    return UpgradePlan(diff, impact, patches, problems)


def _renamed_files(repo: Repo, base: str, head: str) -> dict[str, str]:
    """old path -> new path of files git sees renamed between the revisions."""
    fields = [
        f
        for f in repo.text(
            "diff", "--name-status", "-M", "-z", "--diff-filter=R", "--end-of-options", base, head
        ).split("\0")
        if f
    ]
    return {fields[i + 1]: fields[i + 2] for i in range(0, len(fields) - 2, 3)}
