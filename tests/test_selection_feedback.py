"""The relay feeds the selector: durations and failures of past runs shape the next plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import Run, Selection
from test_selection.observations import Observation, learn
from test_selection.types import TestId
from tests.gitrepo import GitRepo
from tests.relay_fixtures import drain, post_webhook, pull_request, upstream_context

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


def test_the_next_plan_uses_learned_durations_and_failures(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "upstream")
    repo.commit("base", {"test/test_ops.py": TESTS.format(value=1), "torch/ops.py": "x = 1\n"})
    repo.commit("breaks a test", {"test/test_ops.py": TESTS.format(value=2)})
    # the test's own upstream: running it unisolated is a person's choice, as the settings say
    # triage (tests/test_triage.py) would rerun each failure three times: not what this tests
    rt = upstream_context(tmp_path, repo.path, SPEC, runtime="local", triage_max_tests=0)
    steps: list[Next] = []
    with TestClient(create_app(rt, steps.extend)) as client:
        post_webhook(client, "pull_request", pull_request(repo, 1, "synchronize"))
        drain(rt, steps)
        with rt.db.session() as s:
            first = s.scalars(select(Run)).one()
            assert first.conclusion == "failure" and first.counts.get("failed") == 1
            plan = s.scalars(select(Selection).where(Selection.run_id == first.id)).one().plan
            assert {t["duration"] for t in plan["selected"]} == {1.0}  # nothing learned yet
        repo.commit("touches the source", {"torch/ops.py": "x = 2\n"})
        post_webhook(client, "pull_request", pull_request(repo, 2, "synchronize"))
        drain(rt, steps)
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
