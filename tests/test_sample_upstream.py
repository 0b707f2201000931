"""The sample upstream: a real git history laid out like PyTorch."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from ci_relay.sample_upstream import SampleUpstream, build_sample_upstream
from tests.conftest import CliResult


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def test_layout_and_history(sample_upstream: SampleUpstream) -> None:
    root = sample_upstream.path
    assert (root / "aten/src/ATen/native/native_functions.yaml").is_file()
    assert (root / "torch/_refs/__init__.py").is_file()
    tests = sorted(p.name for p in (root / "test").glob("test_*.py"))
    assert tests == [
        "test_binary_ufuncs.py",
        "test_nn_functional.py",
        "test_unary_ufuncs.py",
        "test_view_ops.py",
    ]
    log = _git(root, "log", "--format=%H %s").splitlines()
    assert len(log) == len(sample_upstream.commits) >= 5
    assert log[0].split()[0] == sample_upstream.head
    # commits touch sources, schema and tests together, as upstream changes do
    changed = _git(root, "show", "--name-only", "--format=", sample_upstream.commits[4].sha).split()
    assert set(changed) == {
        "aten/src/ATen/native/native_functions.yaml",
        "test/test_binary_ufuncs.py",
        "torch/_refs/__init__.py",
    }
    assert _git(root, "status", "--porcelain") == ""


def test_commit_ids_are_reproducible(sample_upstream: SampleUpstream, tmp_path: Path) -> None:
    again = build_sample_upstream(tmp_path / "again")
    assert [c.sha for c in again.commits] == [c.sha for c in sample_upstream.commits]


def test_cli_refuses_a_non_empty_folder_unless_forced(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    dest = tmp_path / "up"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    refused = cli("sample-upstream", dest)
    assert refused.code == 2 and "is not empty (use --force to replace it)" in refused.stderr
    assert (dest / "keep.txt").exists()
    built = cli("sample-upstream", dest, "--force")
    assert built.code == 0, built.output
    assert "Decompose gelu" in built.stdout and not (dest / "keep.txt").exists()
