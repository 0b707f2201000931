"""``bench/real_tree.py``: a PyTorch-shaped repository from fetched test files, each checked
against its manifest; CI builds it from a small generated set (the sample upstream's tests)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from ci_relay.sample_upstream import SampleUpstream

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "real_tree.py"


def _fetched(sample: SampleUpstream, folder: Path) -> Path:
    for name in ("test_view_ops.py", "test_binary_ufuncs.py"):
        (folder / "test").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sample.path / "test" / name, folder / "test" / name)
    lines = [
        f"sample/pytorch {sample.head} test/{name} "
        f"sha256={hashlib.sha256((folder / 'test' / name).read_bytes()).hexdigest()} chars=0"
        for name in ("test_view_ops.py", "test_binary_ufuncs.py")
    ]
    (folder / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    return folder


def _build(fetched: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(fetched), str(dest)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_tree_has_the_files_torch_sources_and_three_changes(
    sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    fetched = _fetched(sample_upstream, tmp_path / "fetched")
    done = _build(fetched, tmp_path / "tree")
    assert done.returncode == 0, done.stderr
    built = json.loads(done.stdout)
    assert built["skipped"] == []
    tree = tmp_path / "tree"
    log = _git(tree, "log", "--format=%s").splitlines()
    assert len(log) == 4 and log[-1].startswith("real test files (sample/pytorch@")
    assert log[:3] == [
        "test edit: a note in test/test_view_ops.py",
        "_refs: abs returns a bool input as it is",
        "OpInfo: abs gets a note on its complex dtypes",
    ]
    assert _git(tree, "show", "--stat", "--format=", "HEAD~1").startswith("torch/_refs/__init__.py")
    assert (tree / "test" / "test_binary_ufuncs.py").read_bytes() == (
        fetched / "test" / "test_binary_ufuncs.py"
    ).read_bytes()
    assert (tree / "torch" / "testing" / "_internal" / "common_device_type.py").is_file()
    again = _build(fetched, tmp_path / "again")  # fixed authors and dates: the same commits
    assert json.loads(again.stdout)["commits"] == built["commits"]


def test_a_file_that_does_not_match_its_manifest_stops_it(
    sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    fetched = _fetched(sample_upstream, tmp_path / "fetched")
    with (fetched / "test" / "test_view_ops.py").open("a") as f:
        f.write("# changed after fetching\n")
    done = _build(fetched, tmp_path / "tree")
    assert done.returncode == 2
    assert "test/test_view_ops.py has sha256" in done.stderr
    assert not (tmp_path / "tree").exists()


def test_a_manifest_path_outside_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "MANIFEST.txt").write_text("a/b c0ffee ../etc/x.py sha256=00\n")
    done = _build(tmp_path / "f", tmp_path / "tree")
    assert done.returncode == 2 and "refusing the path '../etc/x.py'" in done.stderr
