"""What a coverage map says about one change: the changed functions it knows, and for each
test of the universe that executed one of them, how specifically (``coverage_map.Reach``).

The map is normally older than the change's base: functions are matched by file and
qualified name, a renamed file through the diff's old path. A changed function the map never
saw (new code, C++ code, a file no recorded test imported) is simply not known; the selector
ranks those changes as it would without a map.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from test_selection.change_analysis import ChangeAnalysis
from test_selection.coverage_map import (
    CoverageIndex,
    CoverageMap,
    CoverageMapError,
    Function,
    Reach,
)
from test_selection.git import GitError, Repo
from test_selection.types import Evidence, TestId

COVERAGE_WEIGHT = 0.6  # a test that called a changed function directly and little else


@dataclass
class CoverageUse:
    """The map's part in one selection (stored in the plan's JSON as ``coverage``)."""

    revision: str
    recorded_at: str
    commits_behind: int | None  # commits from the map's revision to the change's base
    changed: list[str] = field(default_factory=list)  # changed functions, "file:qualname"
    known: list[str] = field(default_factory=list)  # of those, the ones the map has seen
    reach: dict[TestId, Reach] = field(default_factory=dict)

    def evidence(self, test: TestId) -> Evidence | None:
        reach = self.reach.get(test)
        if reach is None:
            return None
        file, name = reach.function
        calls = "directly" if reach.depth == 1 else f"{reach.depth} calls deep"
        return Evidence(
            "candidates",
            "coverage",
            COVERAGE_WEIGHT * reach.specificity,
            f"executed changed {file}:{name} ({calls}; runs {reach.executed} recorded "
            f"functions) in the coverage map of {self.revision[:12]}",
        )

    def note(self) -> str:
        behind = (
            ""
            if self.commits_behind is None
            else f", {self.commits_behind} commits before the base"
        )
        return (
            f"coverage map {self.revision[:12]} (recorded {self.recorded_at}{behind}): knew "
            f"{len(self.known)} of {len(self.changed)} changed function(s); "
            f"{len(self.reach)} test(s) executed one"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "recorded_at": self.recorded_at,
            "commits_behind": self.commits_behind,
            "changed_functions": len(self.changed),
            "known_functions": self.known[:200],
            "tests_reached": len(self.reach),
        }


def check_map(cmap: CoverageMap, repo: Repo, repository: str | None) -> None:
    """Refuse a map of another repository, or of a revision this history lacks."""
    if repository and cmap.repository and cmap.repository != repository:
        raise CoverageMapError(
            f"the coverage map is of {cmap.repository!r}, this upstream is {repository!r}"
        )
    if cmap.revision == "working-tree":
        return
    try:
        repo.resolve(cmap.revision)
    except GitError:
        raise CoverageMapError(
            f"the coverage map's revision {cmap.revision[:12]} is not in {repo.path}'s history "
            f"(a map of {cmap.repository!r}: recorded on another repository, or fetch more history)"
        ) from None


def commits_between(repo: Repo, older: str, newer: str) -> int | None:
    """How many commits ``newer`` is ahead of ``older`` (None: not an ancestor)."""
    try:
        repo.run("merge-base", "--is-ancestor", older, newer)
        return int(repo.text("rev-list", "--count", f"{older}..{newer}").strip())
    except (GitError, ValueError):
        return None


def changed_functions(change: ChangeAnalysis) -> dict[str, list[Function]]:
    """Each changed def of the change ("file:qualname") with the names the map may know it
    by: its own, and for a renamed file the same def under the old path."""
    renamed = {f.path: f.old_path for f in change.files if f.old_path}
    out: dict[str, list[Function]] = {}
    for symbol in sorted(change.symbols):
        path, _, name = symbol.partition(":")
        names = [(path, name)]
        if renamed.get(path):
            names.append((str(renamed[path]), name))
        out[symbol] = names
    return out


def use_map(
    index: CoverageIndex, change: ChangeAnalysis, universe: set[TestId], repo: Repo
) -> CoverageUse:
    """The reach of every universe test into the change's functions, as the map saw it."""
    cmap = index.map
    behind = (
        None
        if cmap.revision == "working-tree"
        else commits_between(repo, cmap.revision, change.base)
    )
    use = CoverageUse(cmap.revision, cmap.recorded_at, behind)
    targets: list[Function] = []
    for symbol, names in changed_functions(change).items():
        use.changed.append(symbol)
        found = [f for file, name in names for f in index.resolve(file, name)]
        if found:
            use.known.append(symbol)
            targets += found
    by_id = {t.nodeid: t for t in universe}
    for test, reach in index.reaches(targets).items():
        if test in by_id:
            use.reach[by_id[test]] = reach
    return use
