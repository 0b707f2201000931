"""The issue-16 path on a small real-shaped tree, as CI can afford it: ``bench/real_tree.py``
builds the tree (generated files stand in for the fetched ones, plus one that does not import
on this torch), a webhook starts a run over every variant on ``spyre-emu`` in two container
shards, each shard stores its results while it runs, the run completes with as many results
as ``specs show`` counts, and the dashboard shows that run in Chromium."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import expect, sync_playwright
from sqlalchemy import func, select

from ci_relay.context import RelayContext
from ci_relay.pipeline import execute
from ci_relay.sample_upstream import SampleUpstream
from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import Run, Shard, ShardState, TestResult
from tests.relay_fixtures import drain, post_webhook, served_app, upstream_context
from tests.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.slow, pytest.mark.container, pytest.mark.browser]
ROOT = Path(__file__).resolve().parents[1]
FILES = ("test_view_ops.py", "test_binary_ufuncs.py")
TOO_OLD = "test_too_old.py"  # imports what torch 2.13 no longer has, like real old files


@dataclass
class TreeRun:
    rt: RelayContext
    run_id: int
    universe: int
    streamed: list[tuple[str, int]]  # (shard state, results stored) after each streamed batch


def _tree(sample: SampleUpstream, tmp: Path) -> Path:
    fetched = tmp / "fetched"
    (fetched / "test").mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(sample.path / "test" / name, fetched / "test" / name)
    (fetched / "test" / TOO_OLD).write_text(
        "from torch._six import inf\n\n\ndef test_never_collected():\n    assert inf\n"
    )
    (fetched / "MANIFEST.txt").write_text(
        "".join(
            f"sample/pytorch {sample.head} test/{p.name} "
            f"sha256={hashlib.sha256(p.read_bytes()).hexdigest()}\n"
            for p in sorted((fetched / "test").iterdir())
        )
    )
    tree = tmp / "tree"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "real_tree.py"), str(fetched), str(tree)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return tree


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def tree_run(
    sample_upstream: SampleUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TreeRun]:
    tmp = tmp_path_factory.mktemp("real-tree")
    tree = _tree(sample_upstream, tmp)
    names = [*FILES, TOO_OLD]
    spec = "test_suite_config:\n  files:\n" + "".join(
        f"    - path: ${{TORCH_ROOT}}/test/{n}\n      unlisted_test_mode: mandatory_success\n"
        for n in names
    )
    rt = upstream_context(
        tmp,
        tree,
        spec,
        backends=("spyre-emu",),
        runtime="container",
        shards_per_run=2,
        devices=2,
        device_lock_dir=tmp / "locks",
        triage_max_tests=0,
    )
    shown = subprocess.run(
        [
            *(sys.executable, "-m", "ci_relay", "specs", "show", str(tmp / "spec.yaml")),
            *("--upstream", str(tree), "--backend", "spyre-emu", "--json"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 1, shown.stderr  # one file does not import: listed apart
    universe = len(json.loads(shown.stdout)) + 1  # + that file's one error result

    streamed: list[tuple[str, int]] = []
    store = execute._store_streamed

    def watched(rt_: RelayContext, shard_id: int, found: list[Any]) -> None:
        store(rt_, shard_id, found)
        with rt_.db.session() as s:
            shard = s.get(Shard, shard_id)
            assert shard is not None
            stored = s.scalar(
                select(func.count()).select_from(TestResult).where(TestResult.shard_id == shard_id)
            )
            streamed.append((shard.state, int(stored or 0)))

    payload = {
        "action": "opened",
        "number": 16,
        "pull_request": {
            "number": 16,
            "head": {"sha": _git(tree, "rev-parse", "HEAD"), "ref": "pr-16"},
            "base": {"sha": _git(tree, "rev-parse", "HEAD~3"), "ref": "main"},
            "labels": [],
        },
        "repository": {"full_name": "sample/pytorch"},
    }
    steps: list[Next] = []
    mp = pytest.MonkeyPatch()
    mp.setattr(execute, "_store_streamed", watched)
    try:
        with TestClient(create_app(rt, steps.extend)) as client:
            post_webhook(client, "pull_request", payload)
            drain(rt, steps)
    finally:
        mp.undo()
    with rt.db.session() as s:
        run_id = s.scalars(select(Run.id)).one()
    yield TreeRun(rt, run_id, universe, streamed)
    rt.db.dispose()


def test_the_whole_universe_runs_in_two_shards_without_loss(tree_run: TreeRun) -> None:
    with tree_run.rt.db.session() as s:
        run = s.get(Run, tree_run.run_id)
        assert run is not None and run.state == "completed"
        shards = list(run.shards)
        assert len(shards) == 2
        assert all(sh.state == ShardState.DONE and sh.runtime == "container" for sh in shards)
        results = [r for sh in shards for r in sh.results]
    assert len(results) == tree_run.universe
    assert len({r.nodeid for r in results}) == len(results)
    errors = [r for r in results if r.outcome == "error"]
    assert [r.nodeid for r in errors] == [f"test/{TOO_OLD}"]
    assert "torch._six" in (errors[0].details or "")
    assert sum(r.outcome == "passed" for r in results) > 0


def test_results_were_stored_while_the_shards_ran(tree_run: TreeRun) -> None:
    running = [stored for state, stored in tree_run.streamed if state == ShardState.RUNNING]
    assert running and running[0] > 0
    assert max(running) < tree_run.universe  # seen before the end, not only at it


def test_the_dashboard_shows_the_run(tree_run: TreeRun, tmp_path: Path) -> None:
    with served_app(tree_run.rt) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{url}/runs/{tree_run.run_id}")
        shards = page.locator("table.shards tbody tr")
        expect(shards).to_have_count(2)
        counts = [int(c) for c in page.locator("td.shard-results .count").all_inner_texts()]
        assert sum(counts) == tree_run.universe
        expect(page.locator("body")).to_contain_text(f"test/{TOO_OLD}")
        page.screenshot(path=str(tmp_path / "real-tree-run.png"), full_page=True)
        browser.close()
