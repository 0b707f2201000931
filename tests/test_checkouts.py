"""Bare mirrors of an upstream, fetched incrementally, and trees materialised from them."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ci_relay.checkouts import CheckoutError, UpstreamMirror, mirror_name
from tests.gitrepo import GitRepo


@pytest.fixture
def upstream(tmp_path: Path) -> GitRepo:
    repo = GitRepo(tmp_path / "upstream")
    repo.commit("initial", {"test/test_a.py": "A = 1\n", "torch/x.py": "X = 1\n"})
    return repo


def _worktrees(mirror: UpstreamMirror) -> list[str]:
    out = subprocess.run(
        ["git", "--git-dir", str(mirror.path), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if line.startswith("worktree ")]


def test_first_use_clones_a_bare_mirror_and_trees_are_removed(
    upstream: GitRepo, tmp_path: Path
) -> None:
    sha = upstream.git("rev-parse", "HEAD")
    mirror = UpstreamMirror(str(upstream.path), tmp_path / "mirrors")
    with mirror.tree(sha) as tree:
        assert (tree / "test" / "test_a.py").read_text() == "A = 1\n"
        seen = tree
    assert not seen.exists()
    bare = subprocess.run(
        ["git", "--git-dir", str(mirror.path), "rev-parse", "--is-bare-repository"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert bare == "true"
    assert len(_worktrees(mirror)) == 1  # only the bare repository itself is left


def test_new_commits_are_fetched_into_the_same_mirror(upstream: GitRepo, tmp_path: Path) -> None:
    mirror = UpstreamMirror(str(upstream.path), tmp_path / "mirrors")
    mirror.ensure(upstream.git("rev-parse", "HEAD"))
    marker = mirror.path / "ci-relay-marker"
    marker.write_text("kept")  # a re-clone would lose it
    second = upstream.commit("second", {"test/test_a.py": "A = 2\n"})
    with mirror.tree(second) as tree:
        assert (tree / "test" / "test_a.py").read_text() == "A = 2\n"
    assert marker.read_text() == "kept"
    assert mirror.rev_parse(f"{second}^") == upstream.git("rev-parse", "HEAD^")


def test_a_pull_request_head_off_every_branch_is_fetched(upstream: GitRepo, tmp_path: Path) -> None:
    mirror = UpstreamMirror(str(upstream.path), tmp_path / "mirrors")
    mirror.ensure(upstream.git("rev-parse", "HEAD"))
    upstream.git("checkout", "-q", "-b", "pr")
    head = upstream.commit("pr change", {"test/test_b.py": "B = 1\n"})
    upstream.git("update-ref", "refs/pull/7/head", head)
    upstream.git("checkout", "-q", "main")
    upstream.git("branch", "-D", "pr")
    with mirror.tree(head) as tree:
        assert (tree / "test" / "test_b.py").exists()


def test_an_unknown_commit_is_a_clear_error(upstream: GitRepo, tmp_path: Path) -> None:
    mirror = UpstreamMirror(str(upstream.path), tmp_path / "mirrors")
    with pytest.raises(CheckoutError, match=r"commit 0{40} is not in"), mirror.tree("0" * 40):
        pass


def test_an_unreachable_source_is_a_clear_error(tmp_path: Path) -> None:
    mirror = UpstreamMirror(str(tmp_path / "missing"), tmp_path / "mirrors")
    with pytest.raises(CheckoutError, match="clone --mirror"):
        mirror.ensure("0" * 40)
    assert not mirror.path.exists()  # no half-made mirror left behind


def test_only_the_needed_paths_can_be_exported(upstream: GitRepo, tmp_path: Path) -> None:
    sha = upstream.git("rev-parse", "HEAD")
    mirror = UpstreamMirror(str(upstream.path), tmp_path / "mirrors")
    with mirror.tree(sha, paths=["test"]) as tree:
        assert (tree / "test" / "test_a.py").exists()
        assert not (tree / "torch").exists()
    with pytest.raises(CheckoutError, match="no-such-dir"), mirror.tree(sha, paths=["no-such-dir"]):
        pass


def test_the_tree_is_removed_when_the_work_in_it_fails(upstream: GitRepo, tmp_path: Path) -> None:
    sha = upstream.git("rev-parse", "HEAD")
    mirror = UpstreamMirror(str(upstream.path), tmp_path / "mirrors")
    seen: list[Path] = []
    with pytest.raises(ZeroDivisionError), mirror.tree(sha) as tree:
        seen.append(tree)
        _ = 1 / 0
    assert not seen[0].exists()
    assert len(_worktrees(mirror)) == 1


def test_concurrent_workers_share_one_mirror(upstream: GitRepo, tmp_path: Path) -> None:
    shas = [upstream.git("rev-parse", "HEAD")]
    for i in range(3):
        shas.append(upstream.commit(f"c{i}", {"test/test_a.py": f"A = {i + 10}\n"}))
    root = tmp_path / "mirrors"

    def work(i: int) -> str:
        sha = shas[i % len(shas)]
        # a new object per worker, as separate worker processes would have
        with UpstreamMirror(str(upstream.path), root).tree(sha) as tree:
            return (tree / "test" / "test_a.py").read_text()

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(work, range(16)))
    expected = ["A = 1\n", "A = 10\n", "A = 11\n", "A = 12\n"]
    assert texts == [expected[i % 4] for i in range(16)]
    assert [p.name for p in root.iterdir() if p.suffix == ".git"] == [
        mirror_name(str(upstream.path))
    ]
    assert len(_worktrees(UpstreamMirror(str(upstream.path), root))) == 1
