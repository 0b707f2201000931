"""A repository's recent history, read once per selection: what every commit changed.

Rankers count co-changes in it, the learned model computes its features from it, and the
backtest replays its commits. One ``git log --raw -M`` call gives the paths of every commit
and the blob ids on both sides of each change, so the backtest can read both versions of a
test file without a second walk over the history. Renames are followed: every commit names
a file by its newest name, so a test file that moved keeps its co-change history.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from test_selection.git import GitError, Repo

HISTORY_COMMITS = 3000  # commits read before the change: bounded whatever the history's size
_NULL = "0" * 40


@dataclass(frozen=True)
class History:
    """Non-merge commits up to a revision, oldest first, and where each path appears
    (postings), so features for any set of sources are cheap."""

    shas: tuple[str, ...]
    files: tuple[tuple[str, ...], ...]
    postings: dict[str, list[int]]
    # folder -> path in it -> commit indexes (for folder-level co-change)
    folder_postings: dict[str, dict[str, list[int]]]
    # per commit: path -> (blob before, blob after) for files it modified (not added/deleted)
    modified: tuple[dict[str, tuple[str, str]], ...] = ()
    truncated: bool = False  # the repository has more commits than were read

    @classmethod
    def read(cls, repo: Repo, rev: str, limit: int = HISTORY_COMMITS) -> History:
        """The history up to ``rev``; a worker keeps the last few it read (a commit's
        history never changes, and each backend's run of a change selects on it)."""
        sha = repo.resolve(rev)
        key = (str(repo.path), sha, limit)
        kept = _READ.get(key)
        if kept is None:
            kept = cls._read(repo, sha, limit)
            if len(_READ) >= _KEEP:
                _READ.pop(next(iter(_READ)))
            _READ[key] = kept
        return kept

    @classmethod
    def _read(cls, repo: Repo, rev: str, limit: int) -> History:
        try:
            text = repo.text(
                "log",
                "--no-merges",
                "--raw",
                "--no-abbrev",
                "-M",
                "--format=%x01%H",
                f"-n{limit + 1}",
                "--end-of-options",
                rev,
                "--",
            )
        except GitError:
            text = ""
        blocks = [b for b in text.split("\x01") if b.strip()]
        truncated = len(blocks) > limit
        shas: list[str] = []
        files: list[tuple[str, ...]] = []
        modified: list[dict[str, tuple[str, str]]] = []
        # a file is known by its newest name: a test file moved last month keeps its history
        current: dict[str, str] = {}
        newest_first: list[tuple[str, list[str], dict[str, tuple[str, str]]]] = []
        for block in blocks[:limit]:
            lines = block.split("\n")
            paths: list[str] = []
            blobs: dict[str, tuple[str, str]] = {}
            renames: list[tuple[str, str]] = []
            for line in lines[1:]:
                if not line.startswith(":"):
                    continue
                meta, _, names = line.partition("\t")
                parts = meta.split()
                if len(parts) < 5 or not names:
                    continue
                status = parts[4][:1]
                if status in "RC":
                    old, _, new = names.partition("\t")
                    if status == "R":
                        renames.append((old, new))
                    path = current.get(new, new)
                else:
                    path = current.get(names, names)
                paths.append(path)
                if status in "MR" and _NULL not in (parts[2], parts[3]) and parts[2] != parts[3]:
                    blobs[path] = (parts[2], parts[3])
            for old, new in renames:  # older commits name the file by its newest name
                current[old] = current.get(new, new)
            newest_first.append((lines[0].strip(), paths, blobs))
        for sha, paths, blobs in reversed(newest_first):
            shas.append(sha)
            files.append(tuple(paths))
            modified.append(blobs)
        postings: dict[str, list[int]] = defaultdict(list)
        for index, changed in enumerate(files):
            for path in changed:
                postings[path].append(index)
        folder_postings: dict[str, dict[str, list[int]]] = defaultdict(dict)
        for path, indexes in postings.items():
            if "/" in path:
                folder_postings[path.rsplit("/", 1)[0]][path] = indexes
        return cls(
            tuple(shas),
            tuple(files),
            dict(postings),
            dict(folder_postings),
            tuple(modified),
            truncated,
        )


_READ: dict[tuple[str, str, int], History] = {}
_KEEP = 4
