"""What a coverage map says about one change: the changed functions it knows, and for each
test of the universe that executed one of them, how specifically (``coverage_map.Reach``).

The map is normally older than the change's base: functions are matched by file and
qualified name, a renamed file through the diff's old path. A changed function the map never
saw (new code, C++ code, a file no recorded test imported) is simply not known; the selector
ranks those changes as it would without a map.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from test_selection.change_analysis import ChangeAnalysis, changed_symbols
from test_selection.coverage.map import (
    CoverageIndex,
    CoverageMap,
    CoverageMapError,
    Function,
    Reach,
    refusal,
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
    # each known changed function ("file:qualname") -> the map's functions it resolved to
    targets: dict[str, list[Function]] = field(default_factory=dict, repr=False)
    # known changed functions whose change is confined to body statements, with those
    # statements' lines, where the map has lines and the file is as the map recorded it
    lines: dict[str, frozenset[int]] = field(default_factory=dict, repr=False)
    # how the plan used it: "evidence" (safe mode, nothing ranked), "prior" (its tests first
    # in their files, unmeasured: too little history), "unused" (the backtest found no
    # gain), or the backtest's REACHED_FIRST / REACHED_FILES ("hand" in plans made before
    # the hand weights were retired)
    used: str = ""
    index: CoverageIndex | None = field(default=None, repr=False, compare=False)  # the map read

    def evidence(self, test: TestId, weight: float = 1.0) -> Evidence | None:
        """Why ``test`` is here, worth ``weight`` times its measured specificity."""
        reach = self.reach.get(test)
        if reach is None:
            return None
        file, name = reach.function
        calls = "directly" if reach.depth == 1 else f"{reach.depth} calls deep"
        return Evidence(
            "candidates",
            "coverage",
            weight * COVERAGE_WEIGHT * reach.specificity,
            f"executed changed {file}:{name} ({calls}; runs {reach.executed} recorded "
            f"functions) in the coverage map of {self.revision[:12]}",
        )

    def add_evidence(
        self, evidence: dict[TestId, list[Evidence]], use: str | None, measured: bool = True
    ) -> str:
        """Add the map's evidence on the tests it reaches, and say how the plan used the
        map. ``use``: None when nothing ranks (safe mode: the map's evidence counts); else the
        chosen candidate's use of the map ("" for none), whose values already carry it (its
        evidence is added at weight 0, to say why); ``measured``: the backtest chose it (not
        prior numbers)."""
        if use is None or use:
            weight = 1.0 if use is None else 0.0
            for test in self.reach:
                said = self.evidence(test, weight)
                if said is not None:
                    evidence.setdefault(test, []).append(said)
        self.used = "evidence" if use is None else "prior" if not measured else (use or "unused")
        return self.usage()

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

    def usage(self) -> str:
        """How the ranking used the map, for the plan's notes."""
        if self.used == "evidence":
            return "coverage map: tests that executed a changed function gain evidence"
        if self.used == "prior":
            return (
                "coverage map used with prior numbers (too little history to measure it): "
                "tests that executed a changed function run first in their file"
            )
        if self.used == "unused":
            return (
                "coverage map not used to rank: replayed on the repository's recent commits, "
                "it found no more edited tests than the ranking without it (the coverage "
                "floor below still uses it, and the other tests that executed a changed "
                "function still go ahead of the ranking)"
            )
        if self.used == "reached-files":
            return (
                "coverage map used (the backtest measured a gain): files whose tests executed a "
                "changed function move up, those tests run first in their file"
            )
        return (
            "coverage map used (the backtest measured a gain): tests that executed a changed "
            "function run first in their file"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "used": self.used,
            "recorded_at": self.recorded_at,
            "commits_behind": self.commits_behind,
            "changed_functions": len(self.changed),
            "known_functions": self.known[:200],
            "tests_reached": len(self.reach),
            "line_level": sorted(self.lines)[:200],
        }


def check_map(cmap: CoverageMap, repo: Repo, repository: str | None) -> None:
    """Refuse a map of another repository, of a revision this history lacks, or one that
    recorded nothing (``coverage_map.refusal``)."""
    if repository and cmap.repository and cmap.repository != repository:
        raise CoverageMapError(
            f"the coverage map is of {cmap.repository!r}, this upstream is {repository!r}"
        )
    if cmap.revision != "working-tree":
        try:
            repo.resolve(cmap.revision)
        except GitError:
            raise CoverageMapError(
                f"the coverage map's revision {cmap.revision[:12]} is not in {repo.path}'s "
                f"history (a map of {cmap.repository!r}: recorded on another repository, or "
                "fetch more history)"
            ) from None
    problem = refusal(cmap)
    if problem:
        raise CoverageMapError(
            f"the coverage map of {cmap.revision[:12]} cannot be used: {problem}"
        )


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
    index: CoverageIndex,
    change: ChangeAnalysis,
    universe: set[TestId],
    repo: Repo,
    is_test: Callable[[str], bool] | None = None,
) -> CoverageUse:
    """The reach of every universe test into the change's functions, as the map saw it.
    Functions of test files (``is_test``) are left out, as the backtest leaves them out of
    past commits: an edited test is chosen for its edit, and a test a change edits executes
    itself."""
    cmap = index.map
    behind = (
        None
        if cmap.revision == "working-tree"
        else commits_between(repo, cmap.revision, change.base)
    )
    use = CoverageUse(cmap.revision, cmap.recorded_at, behind, index=index)
    targets: list[Function] = []
    for symbol, names in changed_functions(change).items():
        if is_test is not None and is_test(symbol.partition(":")[0]):
            continue
        use.changed.append(symbol)
        found = [f for file, name in names for f in index.resolve(file, name)]
        if found:
            use.known.append(symbol)
            use.targets[symbol] = found
            targets += found
    by_id = {t.nodeid: t for t in universe}
    for test, reach in index.reaches(targets).items():
        if test in by_id:
            use.reach[by_id[test]] = reach
    use.lines = _line_level(use, change, cmap, repo)
    return use


def _line_level(
    use: CoverageUse, change: ChangeAnalysis, cmap: CoverageMap, repo: Repo
) -> dict[str, frozenset[int]]:
    """The changed statements' lines of each known changed function, where the map has lines
    of its file as the base has it (a file changed between the map's revision and the base
    may have moved its lines: that function counts whole)."""
    wanted = {s: change.lines[s] for s in use.known if s in change.lines}
    if not wanted or not cmap.lines:
        return {}
    moved: set[str] = set()
    if cmap.revision not in ("working-tree", change.base):
        try:
            moved = set(
                repo.text(
                    "diff", "--name-only", "-z", "--no-renames", "--end-of-options",
                    cmap.revision, change.base,
                ).split("\0")
            )  # fmt: skip
        except GitError:
            return {}
    return {
        symbol: lines
        for symbol, lines in wanted.items()
        if not any(f[0] in moved for f in use.targets[symbol])
    }


def reached_first(order: Sequence[int], reaches: Sequence[Reach | None]) -> list[int]:
    """A file's order with the tests that executed a changed function first, the most
    specific first; the rest keep their order."""
    reached = [i for i in order if reaches[i] is not None]
    reached.sort(key=lambda i: -reaches[i].specificity)  # type: ignore[union-attr]
    return reached + [i for i in order if reaches[i] is None]


# per past commit: test file -> its test (``Class::name``) -> how it reached the change
PastReach = dict[str, dict[str, dict[str, Reach]]]


def past_reach(
    index: CoverageIndex, repo: Repo, changes: Iterable[tuple[str, Mapping[str, tuple[str, str]]]]
) -> PastReach:
    """What the map says each past commit's source change reached (the backtest replays
    coverage on them). ``changes``: per commit, its modified Python sources and their blobs
    before and after (``History.modified``); all are read in one batch. A blob that cannot
    be read reaches nothing."""
    changes = list(changes)
    blobs = sorted({b for _sha, files in changes for pair in files.values() for b in pair})
    try:
        contents = repo.read_blobs(blobs)
    except GitError:
        contents = {}
    out: PastReach = {}
    for sha, files in changes:
        targets: list[Function] = []
        for path, (old, new) in files.items():
            if old not in contents or new not in contents:
                continue
            for name in changed_symbols(path, contents[old], contents[new]):
                targets += index.resolve(path, name)
        by_file: dict[str, dict[str, Reach]] = {}
        for test, reach in index.reaches(targets).items():
            file, _, name = test.partition("::")
            by_file.setdefault(file, {})[name.split("[", 1)[0]] = reach
        out[sha] = by_file
    return out
