"""Assemble a PyTorch-shaped upstream git repository from real PyTorch test files.

The test files come from pytorch/pytorch, fetched one by one with the search tool's
``read_file`` into a folder outside this repository, each listed in that folder's
``MANIFEST.txt`` or ``MANIFEST.<part>.txt`` (``repo commit path sha256=HEX ...``, one per
line; the files may come from different commits, each line says which). This script never
fetches: it checks every file against its sha256 (a mismatch stops it), then builds

1. a first commit: ``torch/`` as the installed wheel's Python sources (what the selector
   analyses; tests import the installed torch) and the test files at their upstream paths;
2. three real-looking changes on top, one commit each, so a relay has changes to select
   for: an OpInfo edit (``abs`` in ``common_methods_invocations.py``), a ``_refs`` change
   (``torch._refs.abs``) and a test edit (the first listed test file). An edit whose text
   is not in this torch version is skipped and said so.

Authors and dates are fixed, so the commit ids are the same on every machine with the same
inputs. Nothing fetched is committed to this repository; CI builds a small generated tree
with the same script (``tests/test_real_tree.py``).

    python bench/real_tree.py $SCRATCH/real $SCRATCH/real-tree [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

AUTHOR = "ci-relay bench <bench@real-tree.invalid>"
DATE = "2026-11-30T12:00:00+00:00"


class TreeError(RuntimeError):
    pass


@dataclass(frozen=True)
class Fetched:
    repo: str
    commit: str
    path: str  # inside the upstream repository, e.g. test/test_view_ops.py
    sha256: str


def read_manifest(folder: Path) -> list[Fetched]:
    """The fetched files, each checked against its sha256 (TreeError on any mismatch)."""
    manifests = sorted(folder.glob("MANIFEST*.txt"))  # MANIFEST.txt, or parts of it
    if not manifests:
        raise TreeError(f"{folder / 'MANIFEST.txt'} is missing (one line per fetched file)")
    out = []
    lines = [
        (manifest, number, line)
        for manifest in manifests
        for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), 1)
    ]
    for manifest, number, line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        fields = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
        if len(parts) < 4 or "sha256" not in fields:
            raise TreeError(f"{manifest}:{number}: expected 'repo commit path sha256=HEX'")
        repo, commit, path = parts[:3]
        if path.startswith("/") or ".." in Path(path).parts or not path.endswith(".py"):
            raise TreeError(f"{manifest}:{number}: refusing the path {path!r}")
        data = (folder / path).read_bytes() if (folder / path).is_file() else None
        if data is None:
            raise TreeError(f"{manifest}:{number}: {folder / path} is missing")
        digest = hashlib.sha256(data).hexdigest()
        if digest != fields["sha256"]:
            raise TreeError(
                f"{manifest}:{number}: {path} has sha256 {digest}, not {fields['sha256']}"
            )
        out.append(Fetched(repo, commit, path, digest))
    if not out:
        raise TreeError(f"{folder}: the manifest lists no file")
    return out


def _git(repo: Path, *args: str) -> str:
    name, _, email = AUTHOR.partition(" <")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=email.rstrip(">"),
        GIT_AUTHOR_DATE=DATE,
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=email.rstrip(">"),
        GIT_COMMITTER_DATE=DATE,
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
    )
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise TreeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _installed_torch() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent


# (message, path in the tree, old text, new text): each applied once, or skipped
CHANGES = [
    (
        "OpInfo: abs gets a note on its complex dtypes",
        "torch/testing/_internal/common_methods_invocations.py",
        "UnaryUfuncInfo('abs',\n",
        "UnaryUfuncInfo('abs',\n                   # chalf: the magnitude is computed in float\n",
    ),
    (
        "_refs: abs returns a bool input as it is",
        "torch/_refs/__init__.py",
        "def abs(a):\n    return prims.abs(a)\n",
        "def abs(a):\n    if a.dtype == torch.bool:\n        return a\n    return prims.abs(a)\n",
    ),
]


def build(folder: Path, dest: Path, force: bool = False) -> dict[str, object]:
    """Build the repository at ``dest``; what it holds (commits, files) as JSON."""
    files = read_manifest(folder)
    if dest.exists() and any(dest.iterdir()):
        if not force:
            raise TreeError(f"{dest} is not empty (--force replaces it)")
        shutil.rmtree(dest)
    dest.mkdir(parents=True, exist_ok=True)
    _git(dest, "init", "-q", "-b", "main")
    torch_dir = _installed_torch()
    for source in sorted(torch_dir.rglob("*.py")):
        target = dest / "torch" / source.relative_to(torch_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    for f in files:
        target = dest / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / f.path, target)
    _git(dest, "add", "-A")
    commits = {"base": ""}
    sources = sorted({f"{f.repo}@{f.commit}" for f in files})
    _git(dest, "commit", "-q", "-m", f"real test files ({', '.join(sources)}) and torch/ sources")
    commits["base"] = _git(dest, "rev-parse", "HEAD")
    skipped = []
    first_test = dest / files[0].path
    test_text = first_test.read_text(encoding="utf-8")
    test_change = (
        f"test edit: a note in {files[0].path}",
        files[0].path,
        test_text.splitlines(keepends=True)[0],
        test_text.splitlines(keepends=True)[0] + "# the relay's bench edited this file\n",
    )
    for message, path, old, new in [*CHANGES, test_change]:
        target = dest / path
        text = target.read_text(encoding="utf-8") if target.is_file() else ""
        if text.count(old) != 1:
            skipped.append(f"{message}: its text is not in {path} once")
            continue
        target.write_text(text.replace(old, new), encoding="utf-8")
        _git(dest, "commit", "-q", "-am", message)
        commits[message] = _git(dest, "rev-parse", "HEAD")
    return {
        "path": str(dest),
        "files": [f.path for f in files],
        "torch_sources": str(torch_dir),
        "commits": commits,
        "skipped": skipped,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("fetched", type=Path, help="the folder with MANIFEST.txt and the files")
    parser.add_argument("dest", type=Path)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    try:
        print(json.dumps(build(args.fetched, args.dest, args.force), indent=2))
    except TreeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
