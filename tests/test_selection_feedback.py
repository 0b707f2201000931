"""The relay feeds the selector: durations and failures of past runs shape the next plan."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.intake.signature import sign
from ci_relay.service.app import create_app
from ci_relay.settings import Settings
from ci_relay.steps import Next
from ci_relay.store.models import Run, Selection
from test_selection.observations import Observation, learn
from test_selection.types import TestId
from tests.gitrepo import GitRepo
from tests.relay_fixtures import SECRET

pytestmark = pytest.mark.slow

SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_ops.py
      unlisted_test_mode: mandatory_success
"""
TESTS = """
import time


def test_slow():
    time.sleep(1.5)


def test_breaks():
    assert {value} == 1


def test_quick():
    pass
"""


def _pr(client: TestClient, repo: GitRepo, number: int) -> None:
    payload = {
        "action": "synchronize",
        "number": number,
        "pull_request": {
            "number": number,
            "head": {"sha": repo.git("rev-parse", "HEAD"), "ref": f"pr-{number}"},
            "base": {"sha": repo.git("rev-parse", "HEAD~1"), "ref": "main"},
            "labels": [],
        },
        "repository": {"full_name": "sample/pytorch"},
    }
    body = json.dumps(payload).encode()
    response = client.post(
        "/webhooks/github",
        content=body,
        headers={
            "X-GitHub-Event": "pull_request",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": sign(SECRET, body),
        },
    )
    assert response.status_code == 202, response.text


def _drain(rt: RelayContext, steps: list[Next]) -> None:
    stale = timedelta(hours=1)
    while steps:
        step = steps.pop(0)
        if step.task == "process":
            steps += pipeline.process_delivery(rt, step.arg)
        elif step.task == "select":
            steps += pipeline.select_tests(rt, step.arg, stale)
        elif step.task == "execute":
            steps += pipeline.execute_shard(rt, step.arg, stale)
        elif step.task == "collect":
            steps += pipeline.collect(rt, step.arg)


def test_the_next_plan_uses_learned_durations_and_failures(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "upstream")
    repo.commit("base", {"test/test_ops.py": TESTS.format(value=1), "torch/ops.py": "x = 1\n"})
    repo.commit("breaks a test", {"test/test_ops.py": TESTS.format(value=2)})
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    policy = tmp_path / "policy.yaml"
    policy.write_text("repositories:\n  sample/pytorch:\n    backends:\n      cpu: {level: L2}\n")
    rt = RelayContext(
        Settings(
            database_url=f"sqlite:///{tmp_path / 'relay.db'}",
            data_dir=tmp_path / "data",
            webhook_secret=SECRET,  # type: ignore[arg-type]
            policy_file=policy,
            upstream_repo=str(repo.path),
            specs=[spec],
            selection_agent="none",
            selection_budget="all",
            runtime="local",  # the test's own upstream: a person's choice, as the settings say
        )
    )
    rt.db.upgrade()
    steps: list[Next] = []
    with TestClient(create_app(rt, steps.extend)) as client:
        _pr(client, repo, 1)
        _drain(rt, steps)
        with rt.db.session() as s:
            first = s.scalars(select(Run)).one()
            assert first.conclusion == "failure" and first.counts.get("failed") == 1
            plan = s.scalars(select(Selection).where(Selection.run_id == first.id)).one().plan
            assert {t["duration"] for t in plan["selected"]} == {1.0}  # nothing learned yet
        repo.commit("touches the source", {"torch/ops.py": "x = 2\n"})
        _pr(client, repo, 2)
        _drain(rt, steps)
        with rt.db.session() as s:
            second = s.scalars(select(Run).order_by(Run.id.desc())).first()
            assert second is not None and second.id != first.id
            plan = s.scalars(select(Selection).where(Selection.run_id == second.id)).one().plan
        page = client.get(f"/runs/{second.id}").text
    planned = {t["test"].rsplit("::", 1)[-1]: t for t in plan["selected"]}
    assert planned["test_slow"]["duration"] >= 1.4  # learned from run 1, not the 1 s guess
    assert planned["test_quick"]["duration"] < 0.5
    reasons = [e["reason"] for e in planned["test_breaks"]["evidence"]]
    assert "failed 1 time(s) recently" in reasons
    assert any("learned from 1 past run(s)" in note for note in plan["notes"])
    assert set(plan["timings"]) >= {"change_analysis", "inventory", "candidates", "plan"}
    assert "selection time" in page and "time est. / actual" in page


def test_variants_of_a_generic_test_add_up_per_run() -> None:
    generic = TestId("test/test_x.py", "TestX", "test_add")
    other = TestId("test/test_x.py", "TestX", "test_add_scalar")
    observations = [
        Observation("test/test_x.py::TestXCPU::test_add_cpu_float32", "passed", 0.5, 1),
        Observation("test/test_x.py::TestXCPU::test_add_cpu_float16", "failed", 0.25, 1),
        Observation("test/test_x.py::TestXCPU::test_add_scalar_cpu", "flaky", 2.0, 1),
        Observation("test/test_x.py::TestXCPU::test_add_cpu_float32", "passed", 1.5, 2),
        Observation("test/test_x.py::TestXCPU::test_add_cpu_float16", "skipped", 9.0, 2),
        Observation("test/test_gone.py::TestGoneCPU::test_gone_cpu", "failed", 1.0, 2),
    ]
    learned = learn(observations, [generic, other])
    assert learned.seconds == {generic: 1.125, other: 2.0}  # median of 0.75 and 1.5
    assert learned.failures == {generic: 1} and learned.flakes == {other: 1}
    assert learned.runs_seen == 2
