"""Upstream trees at a given commit, materialised as throwaway git worktrees."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class CheckoutError(RuntimeError):
    pass


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise CheckoutError(f"git {' '.join(args)} in {repo}: {proc.stderr.strip()}")
    return proc.stdout.strip()


@contextmanager
def worktree(repo: Path, sha: str) -> Iterator[Path]:
    """A detached worktree of ``repo`` at ``sha``, removed afterwards (safe to run concurrently)."""
    _git(repo, "cat-file", "-e", f"{sha}^{{commit}}")
    parent = Path(tempfile.mkdtemp(prefix=f"ci-relay-{sha[:12]}-"))
    path = parent / "tree"
    _git(repo, "worktree", "add", "--detach", "--quiet", str(path), sha)
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", str(path)],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(parent, ignore_errors=True)
