"""Fail closed: a worker without an isolating runtime refuses to run upstream code.

What was reproduced against a running relay before this: a worker without Podman and
without a working bubblewrap fell back to running upstream tests as itself, and a selected
upstream test wrote a file on the worker's filesystem. Here the same hostile upstream goes
through the real pipeline steps (intake to collect) on a worker whose container engine is
unreachable and which has no bubblewrap on its PATH.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay.context import RelayContext
from ci_relay.reporting.build import load_facts, render_callback
from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import OutboxMessage, Run, Shard, TestResult
from tests.gitrepo import GitRepo
from tests.relay_fixtures import drain, post_webhook, pull_request, upstream_context

pytestmark = pytest.mark.slow

SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_hostile.py
      unlisted_test_mode: mandatory_success
"""


def _hostile_test(marker: Path) -> str:
    return f"""
        import pathlib


        def test_writes_on_the_worker():
            pathlib.Path({str(marker)!r}).write_text("upstream code ran here")
        """


@dataclass
class World:
    rt: RelayContext
    client: TestClient
    repo: GitRepo
    marker: Path
    steps: list[Next]

    def send_pr(self) -> None:
        post_webhook(self.client, "pull_request", pull_request(self.repo, 3))

    def drain(self) -> None:
        """Run every queued step in this process, as a worker would."""
        drain(self.rt, self.steps)


@pytest.fixture
def no_isolation_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH with git and tar but without bubblewrap: the sandbox cannot start."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "tar", "prlimit"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))


def _world(tmp_path: Path, **settings: object) -> Iterator[World]:
    marker = tmp_path / "written-by-upstream-code"
    repo = GitRepo(tmp_path / "upstream")
    repo.commit("base", {"test/__init__.py": "", "torch/ok.py": "x = 1\n"})
    repo.commit(
        "a hostile test",
        {"test/test_hostile.py": _hostile_test(marker), "torch/ok.py": "x = 2\n"},
    )
    rt = upstream_context(
        tmp_path,
        repo.path,
        SPEC,
        docker_host="unix:///nonexistent/ci-relay-test.sock",
        crcr_callback_url="http://127.0.0.1:9/crcr",
        **settings,
    )
    steps: list[Next] = []
    with TestClient(create_app(rt, steps.extend)) as client:
        yield World(rt, client, repo, marker, steps)
    rt.db.dispose()


@pytest.fixture
def world(tmp_path: Path, no_isolation_path: None) -> Iterator[World]:
    yield from _world(tmp_path)


def test_a_worker_without_isolation_refuses_to_run_upstream_code(world: World) -> None:
    world.send_pr()
    world.drain()
    assert not world.marker.exists(), "upstream code ran on the worker"
    with world.rt.db.session() as s:
        run = s.scalars(select(Run)).one()
        shard = s.scalars(select(Shard)).one()
        assert (run.state, run.conclusion) == ("completed", "error")
        assert shard.state == "failed" and shard.runtime is None
        assert shard.error is not None and "no isolating runtime on this worker" in shard.error
        assert "container:" in shard.error and "sandbox:" in shard.error  # why each is missing
        assert s.scalars(select(TestResult)).all() == []
        report = s.scalars(select(OutboxMessage).where(OutboxMessage.target == "crcr")).all()
        assert [m.payload.get("event") for m in report][-1] == "completed"
        facts = load_facts(s, run.id, with_failures=True)
    body = json.loads(render_callback(facts, world.rt.settings, "completed", 64 * 1024))
    workflow = body["workflow"]
    assert workflow["conclusion"] == "failure"
    (entry,) = workflow["failed_tests"]
    assert entry["name"] == "(infrastructure)" and "no isolating runtime" in entry["message"]
    page = world.client.get(f"/runs/{run.id}").text
    assert "infrastructure error:" in page and "no isolating runtime on this worker" in page
    (api_shard,) = world.client.get(f"/api/runs/{run.id}").json()["shards"]
    assert "no isolating runtime" in api_shard["error"] and api_shard["isolated"] is None


def test_the_local_demo_runs_unisolated_and_says_so(
    tmp_path: Path, no_isolation_path: None
) -> None:
    for world in _world(tmp_path, local_demo=True):
        world.send_pr()
        world.drain()
        assert world.marker.read_text() == "upstream code ran here"  # a person chose this
        with world.rt.db.session() as s:
            run = s.scalars(select(Run)).one()
            shard = s.scalars(select(Shard)).one()
            assert (run.conclusion, shard.runtime) == ("success", "local")
        page = world.client.get(f"/runs/{run.id}").text
        assert "not isolated" in page
        api = world.client.get(f"/api/runs/{run.id}").json()
        assert api["shards"][0]["isolated"] is False


def test_an_explicit_sandbox_keeps_the_worker_untouched(tmp_path: Path) -> None:
    if shutil.which("bwrap") is None:  # pragma: no cover - setup.sh installs it
        pytest.fail("bubblewrap is missing: run scripts/setup.sh")
    for world in _world(tmp_path, runtime="sandbox"):
        world.send_pr()
        world.drain()
        assert not world.marker.exists()
        with world.rt.db.session() as s:
            shard = s.scalars(select(Shard)).one()
            (result,) = s.scalars(select(TestResult)).all()
            assert shard.runtime == "sandbox" and shard.error is None
            assert result.outcome == "failed"
            # the worker's folders are not even there inside the sandbox
            assert any(
                why in (result.message or "")
                for why in ("Read-only file system", "Permission denied", "No such file")
            ), result.message


def test_a_commit_that_does_not_exist_ends_the_run_with_a_clear_error(world: World) -> None:
    """A well-formed sha nobody pushed: the run ends as an infrastructure error, not stuck."""
    world.repo.commit("another", {"torch/ok.py": "x = 3\n"})
    head = "0123456789abcdef0123456789abcdef01234567"
    payload = {
        "ref": "refs/heads/main",
        "before": world.repo.git("rev-parse", "HEAD"),
        "after": head,
        "repository": {"full_name": "sample/pytorch"},
    }
    post_webhook(world.client, "push", payload)
    world.drain()
    with world.rt.db.session() as s:
        run = s.scalars(select(Run)).one()
        assert (run.state, run.conclusion) == ("completed", "error")
        assert run.error is not None and f"commit {head} is not in" in run.error
