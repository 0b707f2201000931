"""Upstream trees at a given commit: a bare mirror per upstream repository, fetched
incrementally, and throwaway trees materialised from it.

Several workers on one machine share a mirror; every operation that changes it (clone,
fetch, worktree add/remove) holds an exclusive file lock (``filelock``) on a file beside
it, so they never race. The lock is released by the kernel if a worker dies.

Commit ids reach here from webhooks: each is checked to be a full hex commit id before git
sees it, and git gets it after ``--end-of-options`` without a shell, so even a value that
slipped past intake can never become a git option (``--upload-pack=...`` runs a command).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from ci_relay.identifiers import InvalidIdentifier, commit_id

if TYPE_CHECKING:
    from ci_relay.settings import Settings


class CheckoutError(RuntimeError):
    pass


def _checked(sha: str) -> str:
    """``sha`` if it is a full commit id, else a :class:`CheckoutError` (git never runs)."""
    try:
        return commit_id(sha)
    except InvalidIdentifier as exc:
        raise CheckoutError(f"refusing to check out {exc}") from None


def _git(repo: Path | None, *args: str, timeout: float = 3600) -> str:
    prefix = ["git", "--git-dir", str(repo)] if repo is not None else ["git"]
    proc = subprocess.run(
        [*prefix, *args], capture_output=True, text=True, check=False, timeout=timeout
    )
    if proc.returncode != 0:
        where = f" in {repo}" if repo is not None else ""
        raise CheckoutError(f"git {' '.join(args)}{where}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def mirror_name(source: str) -> str:
    """A readable, collision-free folder name for an upstream URL or path."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", source.rstrip("/").rsplit("/", 1)[-1])
    tail = tail.removesuffix(".git") or "repo"
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    return f"{tail}-{digest}.git"


class UpstreamMirror:
    """A bare ``git clone --mirror`` of ``source`` (URL or local path) under ``root``."""

    def __init__(self, source: str | Path, root: Path) -> None:
        self.source = str(source)
        self.path = root / mirror_name(self.source)
        self._lock_path = root / f"{self.path.name}.lock"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(self._lock_path):
            yield

    def _has_commit(self, sha: str) -> bool:
        try:
            _git(self.path, "cat-file", "-e", "--end-of-options", f"{sha}^{{commit}}")
        except CheckoutError:
            return False
        return True

    def _clone(self) -> None:
        """Clone the mirror (the caller holds the lock)."""
        tmp = self.path.with_name(f"{self.path.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            _git(None, "clone", "--mirror", "--quiet", "--", self.source, str(tmp))
            tmp.rename(self.path)  # a half-made clone is never seen as the mirror
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def ensure(self, sha: str) -> Path:
        """The mirror, cloned on first use and fetched only when ``sha`` is not in it yet."""
        sha = _checked(sha)
        if self.path.is_dir() and self._has_commit(sha):
            return self.path
        with self._locked():
            if not self.path.is_dir():
                self._clone()
            elif not self._has_commit(sha):
                _git(self.path, "fetch", "--quiet", "--prune", "origin")
                if not self._has_commit(sha):  # a PR head no ref points at (yet)
                    with suppress(CheckoutError):
                        _git(self.path, "fetch", "--quiet", "--end-of-options", "origin", sha)
            if not self._has_commit(sha):
                raise CheckoutError(f"commit {sha} is not in {self.source} (fetched into {self})")
        return self.path

    def rev_parse(self, spec: str) -> str | None:
        """``spec`` (a commit id, optionally followed by ``^``s) resolved in the mirror, or
        None when it names nothing (a root's parent)."""
        sha = spec.rstrip("^")
        _checked(sha)
        try:
            return (
                _git(self.path, "rev-parse", "--verify", "--quiet", "--end-of-options", spec)
                or None
            )
        except CheckoutError:
            return None

    def branch_head(self, branch: str) -> str:
        """The commit ``branch`` points at upstream now (the mirror cloned or fetched first)."""
        if (
            branch.startswith("-")
            or ".." in branch
            or not re.fullmatch(r"[A-Za-z0-9._/-]+", branch)
        ):
            raise CheckoutError(f"refusing the branch name {branch!r}")
        with self._locked():
            if not self.path.is_dir():
                self._clone()
            else:
                _git(self.path, "fetch", "--quiet", "--prune", "origin")
        try:
            return _git(
                self.path,
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                f"refs/heads/{branch}^{{commit}}",
            )
        except CheckoutError:
            raise CheckoutError(f"{self.source} has no branch {branch!r}") from None

    def commits_between(self, base: str, head: str) -> list[str]:
        """The first-parent commits after ``base`` up to ``head``, oldest first (a range to
        bisect); both must be in the mirror."""
        base, head = _checked(base), _checked(head)
        out = _git(
            self.path,
            "rev-list",
            "--first-parent",
            "--reverse",
            "--end-of-options",
            f"{base}..{head}",
        )
        return out.split()

    def changed_files(self, base: str, head: str) -> list[str]:
        """Paths that differ between two commits in the mirror."""
        base, head = _checked(base), _checked(head)
        out = _git(self.path, "diff", "--name-only", "--no-renames", base, head, "--")
        return out.splitlines()

    @contextmanager
    def tree(self, sha: str, paths: Sequence[str] | None = None) -> Iterator[Path]:
        """The files at ``sha`` in a fresh folder, removed afterwards.

        Without ``paths`` a detached worktree (all files, fast: no clone); with ``paths``
        only those paths, exported with ``git archive`` (for a huge upstream where a shard
        needs one folder).
        """
        sha = _checked(sha)
        if paths and any(p.startswith("-") or "\0" in p for p in paths):
            raise CheckoutError(f"refusing path(s) that look like options: {list(paths)!r}")
        self.ensure(sha)
        parent = Path(tempfile.mkdtemp(prefix=f"ci-relay-{sha[:12]}-"))
        path = parent / "tree"
        try:
            if paths:
                path.mkdir()
                archive = subprocess.Popen(
                    [
                        "git",
                        "--git-dir",
                        str(self.path),
                        "archive",
                        "--format=tar",
                        "--end-of-options",  # after it, every argument is a tree or a path
                        sha,
                        *paths,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                untar = subprocess.run(
                    ["tar", "-x", "-C", str(path)], stdin=archive.stdout, capture_output=True
                )
                assert archive.stdout is not None
                archive.stdout.close()
                err = archive.stderr.read().decode(errors="replace") if archive.stderr else ""
                if archive.wait() != 0 or untar.returncode != 0:
                    raise CheckoutError(
                        f"git archive {sha} -- {' '.join(paths)}: {err.strip()}"
                        f"{untar.stderr.decode(errors='replace').strip()}"
                    )
                yield path
                return
            with self._locked():
                _git(self.path, "worktree", "add", "--detach", "--quiet", "--", str(path), sha)
            try:
                yield path
            finally:
                with self._locked():
                    subprocess.run(
                        [
                            "git",
                            "--git-dir",
                            str(self.path),
                            "worktree",
                            "remove",
                            "--force",
                            str(path),
                        ],
                        capture_output=True,
                        check=False,
                    )
                    subprocess.run(
                        ["git", "--git-dir", str(self.path), "worktree", "prune"],
                        capture_output=True,
                        check=False,
                    )
        finally:
            shutil.rmtree(parent, ignore_errors=True)

    def __str__(self) -> str:
        return str(self.path)


def upstream_mirror(settings: Settings) -> UpstreamMirror:
    """The bare mirror of the configured upstream, shared by every worker on this machine."""
    if settings.upstream_repo is None:
        raise RuntimeError("CI_RELAY_UPSTREAM_REPO is not set: the relay has no upstream to test")
    return UpstreamMirror(settings.upstream_repo, settings.data_dir.resolve() / "mirrors")
