"""Replaying history to measure the selector: hide each commit's test edits, select, compare.

For every commit that changes source and test files together, the selector
sees only the source change (and the tests as they were before the commit);
the test files the commit edited are the ground truth. Baselines at the same
selection size: a seeded random pick, test files by the changed paths' words alone and by
co-change counts alone (whole files in that order until the size is reached).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from test_selection.git import Repo
from test_selection.inventory import DEFAULT_PATTERNS, is_test_path
from test_selection.layout import EmptyUniverse, detect_layout
from test_selection.ranking.history import History
from test_selection.ranking.learned import _words
from test_selection.ranking.rankers import HistoryCounting
from test_selection.selector import SelectorConfig, select

STRATEGIES = ("selector", "random", "path-only", "co-change-only")


@dataclass
class Score:
    hits: int = 0
    truth: int = 0
    changes: int = 0
    changes_hit: int = 0
    selected: int = 0
    universe: int = 0

    def add(self, selected_files: set[str], truth: set[str], selected: int, universe: int) -> None:
        found = len(selected_files & truth)
        self.hits += found
        self.truth += len(truth)
        self.changes += 1
        self.changes_hit += found > 0
        self.selected += selected
        self.universe += universe

    def to_json(self) -> dict[str, float]:
        return {
            "test_file_recall": self.hits / self.truth if self.truth else 0.0,
            "change_recall": self.changes_hit / self.changes if self.changes else 0.0,
            "selection_fraction": self.selected / self.universe if self.universe else 0.0,
        }


@dataclass
class EvalReport:
    commits_seen: int = 0
    evaluated: list[str] = field(default_factory=list)
    scores: dict[str, Score] = field(default_factory=lambda: {s: Score() for s in STRATEGIES})

    def to_json(self) -> dict[str, Any]:
        return {
            "commits_seen": self.commits_seen,
            "commits_evaluated": len(self.evaluated),
            "strategies": {name: score.to_json() for name, score in self.scores.items()},
        }


def _changed(
    repo: Repo, sha: str, patterns: tuple[str, ...] = DEFAULT_PATTERNS
) -> tuple[set[str], set[str]]:
    """(test files edited that existed before, source files changed) of one commit."""
    tests, sources = set(), set()
    for line in repo.text("diff", "--name-status", "--no-renames", f"{sha}^", sha).splitlines():
        status, _, path = line.partition("\t")
        if is_test_path(path, patterns):
            if status != "A":
                tests.add(path)
        elif path.endswith((".py", ".yaml", ".yml", ".cpp", ".h", ".cu")):
            sources.add(path)
    return tests, sources


def evaluate(
    upstream: Path,
    commits: str,
    config: SelectorConfig,
    specs: list[Path] | None = None,
    max_commits: int = 200,
    progress: Callable[[int, int, str], None] | None = None,
) -> EvalReport:
    repo = Repo(upstream)
    shas = repo.text("rev-list", "--no-merges", "--reverse", "--end-of-options", commits).split()
    if not config.patterns and shas:  # one layout for the whole replay: the newest commit's
        config = replace(config, patterns=detect_layout(repo, shas[-1]).patterns)
    patterns = config.patterns or DEFAULT_PATTERNS
    report = EvalReport(commits_seen=len(shas))
    candidates = []
    for sha in shas:
        try:
            parent = repo.resolve(f"{sha}^")
        except Exception:
            continue  # the root commit has nothing to compare with
        tests, sources = _changed(repo, sha, patterns)
        if tests and sources:
            candidates.append((parent, sha, tests, sources))
    candidates = candidates[-max_commits:]
    rng = random.Random(0)
    for i, (parent, sha, truth, sources) in enumerate(candidates, 1):
        if progress:
            progress(i, len(candidates), sha)
        hidden = truth | {
            p
            for p in repo.text("diff", "--name-only", parent, sha).split()
            if is_test_path(p, patterns)
        }
        try:
            plan, _ = select(
                upstream, parent, sha, specs, config, exclude_paths=hidden, inventory_rev=parent
            )
        except EmptyUniverse:
            continue  # no test to choose from before this commit
        universe_files = {p.test.file for p in plan.selected + plan.excluded}
        truth_in = truth & universe_files
        if not truth_in:
            continue
        report.evaluated.append(sha)
        n = len(plan.selected)
        report.scores["selector"].add(
            {p.test.file for p in plan.selected}, truth_in, n, plan.universe_size
        )
        everything = [p.test for p in plan.selected + plan.excluded]
        picked = rng.sample(everything, min(n, len(everything)))
        report.scores["random"].add({t.file for t in picked}, truth_in, n, plan.universe_size)
        sizes = Counter(t.file for t in everything)
        history = History.read(repo, parent, config.history_commits)
        for name in ("path-only", "co-change-only"):
            files = _baseline_files(name, history, sources, sizes, n)
            report.scores[name].add(files, truth_in, n, plan.universe_size)
    return report


def _baseline_files(
    name: str, history: History, sources: set[str], sizes: Mapping[str, int], n: int
) -> set[str]:
    """The test files a one-signal baseline runs for ``n`` tests: by the words their paths
    share with the changed sources ("path-only") or by how often they changed with them
    ("co-change-only"), whole files in that order, the last one cut."""
    files = sorted(sizes)
    if name == "path-only":
        words = set().union(*(_words(s) for s in sources)) if sources else set()
        scores = {f: float(len(words & _words(f))) for f in files}
    else:
        counting = HistoryCounting(word_weight=0.0)
        scores = counting.rank(history, len(history.files), sources, files).scores
    picked: set[str] = set()
    taken = 0
    for path in sorted((f for f in files if scores[f] > 0), key=lambda f: (-scores[f], f)):
        if taken >= n:
            break
        picked.add(path)
        taken += sizes[path]
    return picked
