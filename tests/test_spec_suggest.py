"""``ci-relay specs suggest``: spec edits proposed from the relay's stored results, shown on
the test page too; never applied by themselves."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import Run, Shard, TestResult
from tests.conftest import CliResult
from tests.gitrepo import GitRepo
from tests.relay_fixtures import drain, post_webhook, pull_request, upstream_context

pytestmark = pytest.mark.slow

SPEC = """\
# kept by hand
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_ops.py  # reused whole
      unlisted_test_mode: mandatory_success
      tests:
        - names: [TestOps::test_fine]
          mode: mandatory_success
"""
TESTS = """
import pathlib

COUNTER = pathlib.Path({counter!r})


class TestOps:
    def test_fine(self):
        pass

    def test_broken(self):
        assert {version} < 0, "the kernel returns garbage"

    def test_flaky(self):
        seen = int(COUNTER.read_text()) if COUNTER.exists() else 0
        COUNTER.write_text(str(seen + 1))
        assert seen % 2 == 1, "timing-dependent"
"""


def test_suggestions_from_stored_results(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    counter = tmp_path / "flaky-counter"
    repo = GitRepo(tmp_path / "upstream")
    repo.commit("base", {"test/test_ops.py": TESTS.format(counter=str(counter), version=0)})
    # the test's own upstream: running it unisolated is a person's choice, as the settings say
    # triage (tests/test_triage.py) would rerun each failure three times: not what this tests
    rt = upstream_context(tmp_path, repo.path, SPEC, runtime="local", triage_max_tests=0)
    steps: list[Next] = []
    with TestClient(create_app(rt, steps.extend)) as client:
        for number in (1, 2, 3):
            repo.commit(
                f"change {number}",
                {"test/test_ops.py": TESTS.format(counter=str(counter), version=number)},
            )
            post_webhook(client, "pull_request", pull_request(repo, number))
            drain(rt, steps)
        with rt.db.session() as s:
            runs = s.scalars(select(Run)).all()
            assert len(runs) == 3 and all(r.conclusion == "failure" for r in runs)
            outcomes = {
                (r.nodeid.rsplit("::", 1)[-1], r.outcome)
                for r in s.scalars(select(TestResult).join(Shard))
            }
            assert ("test_flaky", "flaky") in outcomes and ("test_broken", "failed") in outcomes
            broken_id = next(
                r.nodeid for r in s.scalars(select(TestResult)) if r.nodeid.endswith("test_broken")
            )
        page = client.get("/tests", params={"nodeid": broken_id}).text
    assert 'id="suggestions"' in page and 'data-action="xfail"' in page
    assert "failed in all 3 runs" in page

    spec = tmp_path / "spec.yaml"  # the relay's own spec file, as upstream_context wrote it
    before = spec.read_text()
    result = cli(
        "specs", "suggest", spec, "--backend", "cpu", "--json",
        env={"CI_RELAY_DATABASE_URL": rt.settings.database_url},
    )  # fmt: skip
    assert result.code == 0, result.output
    report = json.loads(result.stdout)
    actions = {s["test"].rsplit("::", 1)[-1]: s for s in report["suggestions"]}
    assert set(actions) == {"test_broken", "test_flaky"}, actions
    assert actions["test_broken"]["action"] == "xfail"
    assert "the kernel returns garbage" in actions["test_broken"]["reason"]
    assert actions["test_flaky"]["action"] == "tag"
    patch = report["patch"]
    assert "+        - names: [TestOps::test_broken]" in patch
    assert "+          mode: xfail  # failed in all 3 runs since" in patch
    assert "+        - names: [TestOps::test_flaky]" in patch
    assert "+          tags: [flaky]" in patch
    assert spec.read_text() == before  # a proposal only

    strict = cli(
        "specs", "suggest", spec, "--backend", "cpu", "--min-runs", "4", "--json",
        env={"CI_RELAY_DATABASE_URL": rt.settings.database_url},
    )  # fmt: skip
    assert json.loads(strict.stdout)["suggestions"] == []  # three runs prove less than four
    bad = cli("specs", "suggest", spec, "--flake-action", "delete")
    assert bad.code == 2 and "expected tag or skip" in bad.stderr
