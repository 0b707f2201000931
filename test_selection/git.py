"""Reading a git repository without checking anything out.

Revisions may come from a person or a webhook: every command that takes one puts it after
``--end-of-options``, so a value that starts with ``-`` is never read as an option, and git
runs without a shell.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


class GitError(RuntimeError):
    """A git command failed; the message says which and why, for a person to act on."""


@dataclass(frozen=True)
class Repo:
    path: Path

    def run(self, *args: str, input_bytes: bytes | None = None) -> bytes:
        proc = subprocess.run(
            ["git", "-C", str(self.path), *args],
            input=input_bytes,
            capture_output=True,
            check=False,
        )
        if proc.returncode != 0:
            raise GitError(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout

    def text(self, *args: str) -> str:
        return self.run(*args).decode("utf-8", errors="replace")

    def resolve(self, rev: str) -> str:
        """Full sha of a commit; a clear error for unknown revisions and shallow clones."""
        try:
            return self.text(
                "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"
            ).strip()
        except GitError:
            shallow = (self.path / ".git" / "shallow").exists() or self.text(
                "rev-parse", "--is-shallow-repository"
            ).strip() == "true"
            hint = (
                " (the clone is shallow: fetch more history, e.g. git fetch --unshallow)"
                if shallow
                else ""
            )
            raise GitError(f"unknown revision {rev!r} in {self.path}{hint}") from None

    def tree_id(self, rev: str) -> str:
        return self.text("rev-parse", "--verify", "--end-of-options", f"{rev}^{{tree}}").strip()

    def ls_tree(self, rev: str) -> dict[str, str]:
        """path -> blob sha for every file at ``rev``."""
        out: dict[str, str] = {}
        listing = self.run("ls-tree", "-r", "-z", "--full-tree", "--end-of-options", rev)
        for line in listing.split(b"\0"):
            if not line:
                continue
            meta, _, path = line.partition(b"\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == b"blob":
                out[path.decode("utf-8", errors="replace")] = parts[2].decode()
        return out

    def read_blobs(self, blobs: list[str]) -> dict[str, bytes]:
        """Contents of many blobs in one ``git cat-file --batch`` call."""
        if not blobs:
            return {}
        data = self.run("cat-file", "--batch", input_bytes="\n".join(blobs).encode() + b"\n")
        out: dict[str, bytes] = {}
        pos = 0
        for _ in blobs:
            header_end = data.index(b"\n", pos)
            header = data[pos:header_end].split()
            if len(header) < 3:
                raise GitError(f"git cat-file: {data[pos:header_end].decode(errors='replace')}")
            size = int(header[2])
            start = header_end + 1
            out[header[0].decode()] = data[start : start + size]
            pos = start + size + 1
        return out

    def show(self, rev: str, path: str) -> bytes | None:
        try:
            return self.run("show", "--end-of-options", f"{rev}:{path}")
        except GitError:
            return None
