"""Stage 2: candidate tests, each heuristic a small class returning scored evidence.

Like PyTorch's target determination, scores are in [-1, 1] and summed per test;
unlike it, they are per test function and every score carries its reason.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Protocol

from test_selection.change_analysis import ChangeAnalysis
from test_selection.git import GitError, Repo
from test_selection.inventory import Inventory, TestFunction
from test_selection.types import Evidence, TestId

STAGE = "candidates"

# path/word synonyms: a change under the key also concerns tests named with the values
SYNONYMS: dict[str, set[str]] = {
    "refs": {"ufuncs", "binary", "unary", "reductions"},
    "prims": {"ufuncs", "binary", "unary"},
    "decomp": {"decomp", "nn"},
    "decompositions": {"decomp", "nn"},
    "functional": {"nn", "functional"},
    "nn": {"nn", "modules"},
    "native": {"ufuncs", "binary", "unary"},
    "view": {"view", "views", "shape"},
    "transpose": {"view", "views"},
    "linalg": {"linalg", "matmul"},
    "sparse": {"sparse"},
    "autograd": {"autograd", "grad"},
    "optim": {"optim"},
    "jit": {"jit"},
    "cuda": {"cuda"},
}
_STOP = {
    "torch",
    "test",
    "tests",
    "init",
    "py",
    "src",
    "aten",
    "yaml",
    "csrc",
    "__init__",
    "_",
    "ops",
}


@dataclass
class Context:
    """What heuristics may look at besides the change and the inventory."""

    repo: Repo
    universe: set[TestId]
    failure_history: Mapping[TestId, int] = field(default_factory=dict)
    always_run: tuple[str, ...] = ()
    history_commits: int = 2000
    flake_history: Mapping[TestId, int] = field(default_factory=dict)


class Heuristic(Protocol):
    name: str

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]: ...


def _ev(source: str, score: float, reason: str) -> Evidence:
    clamped = -1.0 if score < -1.0 else 1.0 if score > 1.0 else score
    return Evidence(STAGE, source, clamped, reason)


class EditedByChange:
    """The change adds or edits the test itself (1.0), or edits its test file (0.3)."""

    name = "edited-by-change"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        touched = change.tests_added | change.tests_modified
        for test in touched:
            verb = "adds" if test in change.tests_added else "edits"
            yield test, _ev(self.name, 1.0, f"the change {verb} this test")
        edited_files = {f.path for f in change.files if f.path in inventory.files}
        for path in edited_files:
            file = inventory.files.get(path)
            for fn in file.tests if file else []:
                if fn.id not in touched:
                    yield fn.id, _ev(self.name, 0.3, f"the change edits its file {path}")


class ReferencesChange:
    """The test names a changed operator (0.9) or a changed function or class (0.6).

    Weighted by rarity: a name used by half the suite says little about any one test.
    """

    name = "references-change"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        tests = inventory.tests()
        if not tests or not (change.ops or change.names):
            return
        doc_freq = inventory.reference_counts
        total = len(tests)

        def rarity(name: str) -> float:
            df = doc_freq.get(name, 0)
            return 1.0 if df <= 1 else max(0.2, 1 - math.log(df) / math.log(max(total, 3)))

        source_names = {n for n in change.names if not n.startswith("test")}
        for fn in tests:
            refs = set(fn.references)
            ops = sorted(change.ops & refs)
            names = sorted((source_names - change.ops) & refs)
            if ops:
                best = max(ops, key=rarity)
                yield (
                    fn.id,
                    _ev(self.name, 0.9 * rarity(best), f"uses changed op {', '.join(ops[:3])}"),
                )
            elif names:
                best = max(names, key=rarity)
                yield (
                    fn.id,
                    _ev(self.name, 0.6 * rarity(best), f"uses changed {', '.join(names[:3])}"),
                )


def _words(path: str) -> set[str]:
    words = {w for w in re.split(r"[/_.\-]+", path.lower()) if w and w not in _STOP}
    for word in list(words):
        words |= SYNONYMS.get(word, set())
    return words


class PathKeywords:
    """Words of changed paths (and synonyms) in the test file's name: 0.2 a word, up to 0.6."""

    name = "path-keywords"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        words: set[str] = set()
        for f in change.source_files:
            words |= _words(f.path)
        words |= {n.lower() for n in change.ops}
        if not words:
            return
        for path, file in inventory.files.items():
            stem = path.rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
            hits = sorted(words & set(stem.split("_")))
            if hits:
                score = min(0.6, 0.2 * len(hits))
                for fn in file.tests:
                    yield (
                        fn.id,
                        _ev(self.name, score, f"its file name matches {', '.join(hits[:3])}"),
                    )


class CoChange:
    """Test files that changed together with the changed source files in past commits."""

    name = "co-change"

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int], list[list[str]]] = {}

    def history(self, repo: Repo, base: str, limit: int) -> list[list[str]]:
        key = (base, limit)
        if key not in self._cache:
            try:
                text = repo.text(
                    "log",
                    "--no-merges",
                    "--name-only",
                    "--format=%x01",
                    f"-n{limit}",
                    "--end-of-options",
                    base,
                    "--",
                )
            except GitError:
                text = ""
            commits = [[p for p in block.split("\n") if p] for block in text.split("\x01")]
            self._cache[key] = [c for c in commits if c]
        return self._cache[key]

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        sources = {f.path for f in change.source_files} | {
            f.old_path for f in change.source_files if f.old_path
        }
        if not sources:
            return
        together: Counter[str] = Counter()
        seen: Counter[str] = Counter()
        for commit in self.history(ctx.repo, change.base, ctx.history_commits):
            touched = sources.intersection(commit)
            if not touched:
                continue
            tests = [p for p in commit if p in inventory.files]
            for src in touched:
                seen[src] += 1
            for test_file in tests:
                together[test_file] += 1
        if not together:
            return
        norm = max(seen.values())
        for path, count in together.items():
            score = 0.7 * min(1.0, count / norm)
            for fn in inventory.files[path].tests:
                yield (
                    fn.id,
                    _ev(
                        self.name,
                        score,
                        f"its file changed with these sources in {count} past commit(s)",
                    ),
                )


class FailureHistory:
    """Tests that failed recently in the relay's own results (flaky ones count less: a
    failure that passes on rerun says less about the change)."""

    name = "failure-history"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        for test in set(ctx.failure_history) | set(ctx.flake_history):
            failures = ctx.failure_history.get(test, 0)
            flakes = ctx.flake_history.get(test, 0)
            if failures > 0:
                yield (
                    test,
                    _ev(
                        self.name,
                        0.5 * min(1.0, failures / 3),
                        f"failed {failures} time(s) recently",
                    ),
                )
            elif flakes > 0:
                yield test, _ev(self.name, 0.1, f"flaky {flakes} time(s) recently")


class AlwaysRun:
    """Tests the operator always runs (globs over node ids)."""

    name = "always-run"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        if not ctx.always_run:
            return
        for fn in inventory.tests():
            pattern = next((p for p in ctx.always_run if fnmatchcase(fn.id.nodeid, p)), None)
            if pattern:
                yield fn.id, _ev(self.name, 1.0, f"always run ({pattern})")


def default_heuristics() -> list[Heuristic]:
    return [
        EditedByChange(),
        ReferencesChange(),
        PathKeywords(),
        CoChange(),
        FailureHistory(),
        AlwaysRun(),
    ]


def collect_evidence(
    change: ChangeAnalysis,
    inventory: Inventory,
    ctx: Context,
    heuristics: list[Heuristic] | None = None,
) -> dict[TestId, list[Evidence]]:
    """Evidence per test in the universe; one item per heuristic (its strongest)."""
    best: dict[tuple[TestId, str], Evidence] = {}
    for heuristic in heuristics or default_heuristics():
        for test, ev in heuristic.evidence(change, inventory, ctx):
            if test not in ctx.universe:
                continue
            key = (test, heuristic.name)
            if key not in best or ev.score > best[key].score:
                best[key] = ev
    out: dict[TestId, list[Evidence]] = defaultdict(list)
    for (test, _), ev in best.items():
        out[test].append(ev)
    return dict(out)


def tests_of(inventory: Inventory) -> dict[TestId, TestFunction]:
    return inventory.by_id()
