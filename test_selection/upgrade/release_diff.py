"""A test-level diff of a reused test universe between two upstream revisions.

Moving a backend from one upstream release to the next should rerun the tests that changed,
not all of them. Between revisions ``A`` and ``B`` (any number of commits apart: only the two
trees are compared, never the commits between) every test of the given files is one of:

- ``added`` / ``removed``: only at B / only at A;
- ``renamed`` / ``moved``: its body (everything but the name) is at A under another name, in
  the same class (renamed) or another class or file (moved);
- ``body``: same name, different body or decorators;
- ``dependencies``: same body, but something it depends on changed: a helper, base class or
  decorator it names (anywhere in the tree), a fixture method of its class (``setUp``...), or
  an OpInfo entry (dtypes, sample inputs, references, decompositions) of an ``@ops`` test;
- unchanged otherwise, which needs no run.

Every changed test carries the evidence that put it there. Test files are read with ``ast``
from git objects: nothing is imported, nothing is checked out.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from test_selection.change_analysis import ChangeAnalysis, _defs, analyze
from test_selection.git import Repo
from test_selection.types import TestId

ChangeKind = Literal["added", "removed", "renamed", "moved", "body", "dependencies"]
KINDS: tuple[ChangeKind, ...] = ("added", "removed", "renamed", "moved", "body", "dependencies")
FIXTURE_METHODS = frozenset({"setUp", "tearDown", "setUpClass", "tearDownClass", "_setUp"})
OPINFO_FILES = re.compile(
    r"^torch/testing/_internal/(common_methods_invocations\.py|opinfo/definitions/[\w/]+\.py)$"
)
_OPINFO_CALL = re.compile(r"(^|\.)\w*(OpInfo|Info)$")
MAX_EVIDENCE = 4  # reasons kept per test: enough to see why, not a dump


@dataclass(frozen=True)
class TestChange:
    """One test that needs a run at B (or that went away), and why."""

    __test__ = False

    test: str  # FILE::Class::name at B (at A for a removed test)
    kind: ChangeKind
    evidence: tuple[str, ...]
    was: str | None = None  # the name at A of a renamed or moved test
    ops: tuple[str, ...] = ()  # an @ops test changed only through these ops' entries

    def to_json(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "kind": self.kind,
            "evidence": list(self.evidence),
            "was": self.was,
            "ops": list(self.ops),
        }


@dataclass
class ReleaseDiff:
    """What changed between two revisions, test by test, for the files a spec reuses."""

    base: str
    head: str
    commits: int
    files_changed: int
    tests_at_base: int
    tests_at_head: int
    changes: list[TestChange] = field(default_factory=list)
    ops_changed: list[str] = field(default_factory=list)
    ops_added: list[str] = field(default_factory=list)
    ops_removed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def needing_run(self) -> list[TestChange]:
        return [c for c in self.changes if c.kind != "removed"]

    def renames(self) -> dict[str, str]:
        """Old node id -> new node id of every renamed or moved test."""
        return {c.was: c.test for c in self.changes if c.was is not None}

    def run_list(self) -> list[str]:
        """``FILE::Class::test`` lines of what changed, the ``--tests`` format of a run."""
        return sorted(c.test for c in self.needing_run())

    def by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = dict.fromkeys(KINDS, 0)
        for change in self.changes:
            counts[change.kind] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "head": self.head,
            "commits": self.commits,
            "files_changed": self.files_changed,
            "tests_at_base": self.tests_at_base,
            "tests_at_head": self.tests_at_head,
            "need_run": len(self.needing_run()),
            "by_kind": self.by_kind(),
            "changes": [c.to_json() for c in self.changes],
            "ops_changed": self.ops_changed,
            "ops_added": self.ops_added,
            "ops_removed": self.ops_removed,
            "notes": self.notes,
        }


# --- reading one side ------------------------------------------------------------------


@dataclass
class _Side:
    """The tests of the universe's files at one revision, with what a diff compares."""

    bodies: dict[TestId, str] = field(default_factory=dict)  # digest without the name
    references: dict[TestId, set[str]] = field(default_factory=dict)
    decorated_ops: set[TestId] = field(default_factory=set)
    class_parts: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    bases: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    unparsable: dict[str, str] = field(default_factory=dict)
    imported: set[str] = field(default_factory=set)  # top-level modules the files import


def _digest(node: ast.AST) -> str:
    return hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16]


def _body_digest(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The test as written, its name left out (so that a rename keeps its digest)."""
    clone = ast.parse(ast.unparse(fn)).body[0]
    assert isinstance(clone, ast.FunctionDef | ast.AsyncFunctionDef)
    clone.name = "_"
    return _digest(clone)


def _read_side(repo: Repo, rev: str, files: list[str]) -> _Side:
    side = _Side()
    listing = repo.ls_tree(rev)
    top_level = {path.split("/", 1)[0].removesuffix(".py") for path in listing}
    present = [f for f in files if f in listing]
    blobs = repo.read_blobs([listing[f] for f in present])
    for path in present:
        source = blobs[listing[path]]
        try:
            tree = ast.parse(source, filename=path)
        except (SyntaxError, ValueError) as exc:
            side.unparsable[path] = f"{type(exc).__name__}: {exc}"
            continue
        functions: dict[tuple[str | None, str], ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                parts: dict[str, str] = {}
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        if item.name.startswith("test"):
                            functions[(node.name, item.name)] = item
                        else:
                            parts[item.name] = _digest(item)
                header = ast.ClassDef(
                    name=node.name,
                    bases=node.bases,
                    keywords=node.keywords,
                    body=[
                        n
                        for n in node.body
                        if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                    ]
                    or [ast.Pass()],
                    decorator_list=node.decorator_list,
                )
                parts["<class>"] = _digest(header)
                side.class_parts[(path, node.name)] = parts
                side.bases[(path, node.name)] = {
                    n.id if isinstance(n, ast.Name) else ast.unparse(n).rsplit(".", 1)[-1]
                    for n in node.bases
                }
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                functions[(None, node.name)] = node
        external = _external_names(tree, top_level)
        side.imported |= _imported_top_level(tree)
        module_vars = _module_variables(tree, external)
        for (cls, name), fn in functions.items():
            test = TestId(path, cls, name)
            side.bodies[test] = _body_digest(fn)
            refs = _references(fn, external)
            for var in list(refs):  # @ops(_binary_ops): the names the list is built from
                refs |= module_vars.get(var, set())
            side.references[test] = refs
            if any(_decorator_name(d) == "ops" for d in fn.decorator_list):
                side.decorated_ops.add(test)
    return side


def _external_names(tree: ast.Module, top_level: set[str]) -> set[str]:
    """Names a test file binds to modules from outside the repository (``pytest``, ``np``):
    ``pytest.mark.parametrize`` says nothing about a changed method named ``mark``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in top_level:
                    out.add(alias.asname or alias.name.split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and not node.level
            and node.module.split(".")[0] not in top_level
        ):
            out.update(alias.asname or alias.name for alias in node.names)
    return out


def _imported_top_level(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def _references(node: ast.AST, external: set[str]) -> set[str]:
    """The names a test uses: identifiers, and attributes of anything but an external
    module (``td.clone()`` counts ``clone``; ``pytest.mark`` counts nothing)."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            root: ast.expr = sub
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in external):
                out.add(sub.attr)
    return out - external


def _module_variables(tree: ast.Module, external: set[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = _references(node.value, external)
    return out


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target).rsplit(".", 1)[-1]


# --- the op database -------------------------------------------------------------------


def _parsed(source: bytes | None, path: str) -> ast.Module | None:
    """The module, or None when the file is absent or does not parse at this side."""
    if source is None:
        return None
    try:
        return ast.parse(source, filename=path)
    except (SyntaxError, ValueError):
        return None


def _opinfo_entries(source: bytes | None, path: str) -> dict[str, tuple[str, set[str]]]:
    """OpInfo name -> (digest of its entry, names the entry refers to), for one file."""
    tree = _parsed(source, path)
    if tree is None:
        return {}
    entries: dict[str, tuple[str, set[str]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        if not _OPINFO_CALL.search(ast.unparse(node.func)):
            continue
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue
        variant = next(
            (
                k.value.value
                for k in node.keywords
                if k.arg == "variant_test_name"
                and isinstance(k.value, ast.Constant)
                and isinstance(k.value.value, str)
            ),
            "",
        )
        name = f"{first.value}.{variant}" if variant else first.value
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
        entries[name] = (_digest(node), names)
    return entries


def _op_database(repo: Repo, rev: str, files: list[str]) -> dict[str, tuple[str, set[str]]]:
    entries: dict[str, tuple[str, set[str]]] = {}
    for path in files:
        entries.update(_opinfo_entries(repo.show(rev, path), path))
    return entries


def _op_changes(
    repo: Repo, base: str, head: str, changed_names: set[str]
) -> tuple[set[str], set[str], set[str], dict[str, str], set[str]]:
    """Ops whose entries changed, appeared and vanished, why each changed, and every op name
    the head's OpInfo database defines (empty: the tree has none)."""
    files = sorted(
        {path for rev in (base, head) for path in repo.ls_tree(rev) if OPINFO_FILES.match(path)}
    )
    if not files:
        return set(), set(), set(), {}, set()
    before, after = _op_database(repo, base, files), _op_database(repo, head, files)
    why: dict[str, str] = {}
    for op in before.keys() & after.keys():
        if before[op][0] != after[op][0]:
            why[op] = f"its OpInfo entry changed (dtypes, samples or options) in {head[:12]}"
            continue
        helpers = sorted(after[op][1] & changed_names)
        if helpers:
            why[op] = f"its OpInfo entry uses {', '.join(helpers[:3])}, changed"
    added, removed = set(after) - set(before), set(before) - set(after)
    return set(why), added, removed, why, {name.split(".")[0] for name in after}


# --- the diff --------------------------------------------------------------------------


def _without_docstrings(source: bytes | None, path: str) -> dict[str, str]:
    """Qualified name -> AST dump of every def, class and assignment, docstrings left out."""
    tree = _parsed(source, path)
    if tree is None:
        return {}
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return {
        name: ast.dump(span[0]) for name, span in _defs(ast.unparse(tree).encode(), path)[0].items()
    }


def _cosmetic(repo: Repo, analysis: ChangeAnalysis) -> set[str]:
    """Changed symbols (``path:qualified``) whose change cannot alter behaviour: a docstring
    edit, or code that left one module and arrived in another (with at most its docstring
    edited), which both files otherwise show as changed."""
    old: dict[str, dict[str, str]] = {}
    new: dict[str, dict[str, str]] = {}
    for change in analysis.files:
        if not change.path.endswith(".py") or change.binary:
            continue
        old_path = change.old_path or change.path
        if change.status != "A":
            old[change.path] = _without_docstrings(repo.show(analysis.base, old_path), old_path)
        if change.status != "D":
            new[change.path] = _without_docstrings(
                repo.show(analysis.head, change.path), change.path
            )
    before: dict[str, set[str]] = defaultdict(set)
    after: dict[str, set[str]] = defaultdict(set)
    for defs in old.values():
        for name, dump in defs.items():
            before[name].add(dump)
    for defs in new.values():
        for name, dump in defs.items():
            after[name].add(dump)
    cosmetic: set[str] = set()
    for symbol in analysis.symbols:
        path, _, name = symbol.partition(":")
        here_old, here_new = old.get(path, {}).get(name), new.get(path, {}).get(name)
        if here_old is not None and here_old == here_new:
            cosmetic.add(symbol)  # only its docstring changed
        elif here_old is None and here_new is not None and here_new in before.get(name, ()):
            cosmetic.add(symbol)  # arrived from another module
        elif here_new is None and here_old is not None and here_old in after.get(name, ()):
            cosmetic.add(symbol)  # left for another module
    return cosmetic


def _importable(path: str, universe: list[str], imported: set[str]) -> bool:
    """Whether the universe's tests can reach code in ``path``: a package or module they
    import, or a helper beside them (benchmarks, docs and other folders cannot)."""
    top = path.split("/", 1)[0].removesuffix(".py")
    if top in imported:
        return True
    folders = {file.rsplit("/", 1)[0] for file in universe if "/" in file}
    return any(path.startswith(folder + "/") for folder in folders)


def _changed_elsewhere(
    repo: Repo, analysis: ChangeAnalysis, universe: list[str], imported: set[str]
) -> dict[str, list[str]]:
    """Bare name -> where it changed, for every non-test def, class or assignment the
    universe's tests can reach; docstring edits and code moved between modules left out."""
    cosmetic = _cosmetic(repo, analysis) if not analysis.truncated else set()
    where: dict[str, list[str]] = defaultdict(list)
    for symbol in sorted(analysis.symbols):
        path, _, qualified = symbol.partition(":")
        name = qualified.rsplit(".", 1)[-1]
        if name.startswith("test") or (name.startswith("__") and name.endswith("__")):
            continue
        if len(name) < 3 or symbol in cosmetic or not _importable(path, universe, imported):
            continue
        where[name].append(f"{path}:{qualified}")
    return where


def diff_release(
    repo: Repo,
    base: str,
    head: str,
    files_at_base: list[str],
    files_at_head: list[str],
) -> ReleaseDiff:
    """Compare the tests of the given files (repository-relative) between two revisions."""
    base_sha, head_sha = repo.resolve(base), repo.resolve(head)
    commits = int(repo.text("rev-list", "--count", f"{base_sha}..{head_sha}").strip() or 0)
    analysis = analyze(repo, base_sha, head_sha)
    old = _read_side(repo, base_sha, files_at_base)
    new = _read_side(repo, head_sha, files_at_head)
    result = ReleaseDiff(
        base=base_sha,
        head=head_sha,
        commits=commits,
        files_changed=len(analysis.files),
        tests_at_base=len(old.bodies),
        tests_at_head=len(new.bodies),
    )
    elsewhere = _changed_elsewhere(repo, analysis, files_at_head, old.imported | new.imported)
    changed_ops, ops_added, ops_removed, op_why, known = _op_changes(
        repo, base_sha, head_sha, set(elsewhere)
    )
    for op in analysis.ops:  # _refs, decompositions, native_functions.yaml
        if known and op not in known and op.split(".")[0] not in known:
            continue  # a helper's name in _refs or _decomp, not an op the tests know
        if op not in op_why:
            op_why[op] = "its reference, decomposition or schema changed"
            changed_ops.add(op)
    result.ops_changed, result.ops_added = sorted(changed_ops), sorted(ops_added)
    result.ops_removed = sorted(ops_removed)
    wide = analysis.truncated  # too many files to compare symbol by symbol
    if wide:
        result.notes.append(
            f"{len(analysis.files)} files changed between the revisions: too many to compare "
            "helpers symbol by symbol, so every test that is still there counts as changed"
        )
    for path, problem in {**old.unparsable, **new.unparsable}.items():
        result.notes.append(
            f"{path} does not parse at one side ({problem}): its tests count as changed"
        )

    only_new = {t: d for t, d in new.bodies.items() if t not in old.bodies}
    only_old = {t: d for t, d in old.bodies.items() if t not in new.bodies}
    by_digest_old: dict[str, list[TestId]] = defaultdict(list)
    for test, digest in sorted(only_old.items(), key=lambda kv: kv[0].sort_key):
        by_digest_old[digest].append(test)
    changes: list[TestChange] = []
    for test, digest in sorted(only_new.items(), key=lambda kv: kv[0].sort_key):
        candidates = by_digest_old.get(digest)
        if candidates:
            same_class = [c for c in candidates if (c.file, c.cls) == (test.file, test.cls)]
            was = (same_class or candidates)[0]
            candidates.remove(was)
            del only_old[was]
            kind: ChangeKind = "renamed" if same_class else "moved"
            changes.append(
                TestChange(test.nodeid, kind, (f"same body as {was.nodeid} at A",), was=was.nodeid)
            )
        elif test.file in old.unparsable:
            changes.append(TestChange(test.nodeid, "body", ("its file does not parse at A",)))
        else:
            changes.append(TestChange(test.nodeid, "added", ("not at A",)))
    for test in sorted(only_old, key=lambda t: t.sort_key):
        why = "its file does not parse at B" if test.file in new.unparsable else "not at B"
        changes.append(TestChange(test.nodeid, "removed", (why,)))

    for test in sorted(old.bodies.keys() & new.bodies.keys(), key=lambda t: t.sort_key):
        if old.bodies[test] != new.bodies[test]:
            changes.append(TestChange(test.nodeid, "body", ("its body or decorators changed",)))
            continue
        evidence, ops = _dependency_evidence(test, old, new, elsewhere, changed_ops, op_why)
        if wide and not evidence:
            evidence = ["the range is too wide to rule out a changed helper"]
        if evidence:
            changes.append(
                TestChange(test.nodeid, "dependencies", tuple(evidence[:MAX_EVIDENCE]), ops=ops)
            )
    result.changes = changes
    return result


def _dependency_evidence(
    test: TestId,
    old: _Side,
    new: _Side,
    elsewhere: dict[str, list[str]],
    changed_ops: set[str],
    op_why: dict[str, str],
) -> tuple[list[str], tuple[str, ...]]:
    """Why an unchanged test still needs a run (empty: it does not), and, for an ``@ops``
    test changed only through the op database, the ops whose variants need it."""
    evidence: list[str] = []
    if test.cls is not None:
        key = (test.file, test.cls)
        before, after = old.class_parts.get(key, {}), new.class_parts.get(key, {})
        if before.get("<class>") != after.get("<class>"):
            evidence.append(f"class {test.cls}: its bases, decorators or attributes changed")
        refs = new.references.get(test, set())
        for method in sorted(before.keys() | after.keys()):
            if method == "<class>" or before.get(method) == after.get(method):
                continue
            if method in FIXTURE_METHODS or method in refs:
                evidence.append(f"{test.cls}.{method} changed")
        for base in sorted(new.bases.get(key, set())):
            if base in elsewhere:
                evidence.append(f"base class {base} changed ({elsewhere[base][0]})")
    for name in sorted(new.references.get(test, set()) & elsewhere.keys()):
        if test.cls is not None and f"{test.file}:{test.cls}.{name}" in elsewhere[name]:
            continue  # a method of its own class: judged above
        evidence.append(f"uses {name}, changed in {elsewhere[name][0]}")
    ops: tuple[str, ...] = ()
    if test in new.decorated_ops and changed_ops:
        ops = tuple(sorted(changed_ops))
        if not evidence:
            shown = ", ".join(ops[:5]) + (f" and {len(ops) - 5} more" if len(ops) > 5 else "")
            evidence.append(f"@ops test; the entries of these ops changed: {shown}")
            if len(ops) == 1:
                evidence.append(f"{ops[0]}: {op_why[ops[0]]}")
        else:
            ops = ()  # changed for other reasons: every variant needs the run
    return evidence, ops
