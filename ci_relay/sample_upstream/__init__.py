"""Build a small git repository laid out like a PyTorch checkout, with real history.

It stands in for a PyTorch checkout in tests, demos and benchmarks: ``torch/``
stand-in sources, ``aten/src/ATen/native/native_functions.yaml`` and
``test/test_*.py`` files written against the installed torch's
``torch.testing._internal``. Commit ids are reproducible: authors, dates and
contents are fixed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

DATA_DIR = Path(__file__).parent
COMMITS_DIR = DATA_DIR / "commits"


class SampleUpstreamError(RuntimeError):
    """The destination cannot hold a new sample upstream, or git failed."""


@dataclass(frozen=True)
class SampleCommit:
    sha: str
    message: str


@dataclass(frozen=True)
class SampleUpstream:
    path: Path
    commits: list[SampleCommit]

    @property
    def head(self) -> str:
        return self.commits[-1].sha


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SampleUpstreamError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _commit_env(author: str, date: str) -> dict[str, str]:
    name, _, email = author.partition(" <")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k == "GIT_EXEC_PATH"}
    env.update(
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=email.rstrip(">"),
        GIT_AUTHOR_DATE=date,
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=email.rstrip(">"),
        GIT_COMMITTER_DATE=date,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
    )
    return env


def build_sample_upstream(dest: Path, *, force: bool = False) -> SampleUpstream:
    """Create the sample repository at ``dest`` (absent or empty; ``force`` replaces it)."""
    dest = dest.resolve()
    if dest.exists() and any(dest.iterdir()):
        if not force:
            raise SampleUpstreamError(f"{dest} is not empty (use --force to replace it)")
        shutil.rmtree(dest)
    dest.mkdir(parents=True, exist_ok=True)
    history = yaml.safe_load((DATA_DIR / "commits.yaml").read_text(encoding="utf-8"))
    base_env = _commit_env("ci-relay <ci-relay@sample-upstream.invalid>", "2026-09-01T00:00:00Z")
    _git(dest, "init", "-q", "-b", "main", env=base_env)
    commits: list[SampleCommit] = []
    for step in history:
        env = _commit_env(step["author"], step["date"])
        if "dir" in step:
            src = COMMITS_DIR / step["dir"]
            for file in sorted(p for p in src.rglob("*") if p.is_file()):
                if "__pycache__" in file.parts:
                    continue
                target = dest / file.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(file, target)
        else:
            _git(dest, "apply", "--whitespace=nowarn", str(COMMITS_DIR / step["patch"]), env=env)
        _git(dest, "add", "-A", env=env)
        _git(dest, "commit", "-q", "-m", step["message"], env=env)
        commits.append(SampleCommit(_git(dest, "rev-parse", "HEAD", env=env), step["message"]))
    return SampleUpstream(dest, commits)
