"""Spec drift: what a spec lists and upstream no longer has never stops the relay's runs,
and is shown where people look (the run page, its JSON, the GitHub check summary)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay.reporting.build import load_facts
from ci_relay.reporting.github import output
from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import Run, Selection
from reuse_specs.errors import SpecErrors
from reuse_specs.loader import load_specs
from reuse_specs.upstream_check import check_against_upstream, find_drift
from tests.gitrepo import GitRepo
from tests.relay_fixtures import drain, post_webhook, pull_request, upstream_context

SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_ops.py
      unlisted_test_mode: mandatory_success
      tests:
        - names: [TestOps::test_add_old_name]
          mode: skip  # known to hang on the card
"""
BEFORE = """
class TestOps:
    def test_add_old_name(self):
        pass

    def test_mul(self):
        pass
"""
AFTER = BEFORE.replace("test_add_old_name", "test_add_new_name")


def _spec(tmp_path: Path, text: str = SPEC) -> Path:
    path = tmp_path / "drift.yaml"
    path.write_text(text.lstrip("\n"))
    return path


def test_drift_names_the_vanished_test_and_its_likely_rename(tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    (upstream / "test").mkdir(parents=True)
    (upstream / "test" / "test_ops.py").write_text(AFTER)
    spec = load_specs([_spec(tmp_path)], upstream)
    (drift,) = find_drift(spec)
    assert (drift.kind, drift.listed, drift.likely) == (
        "name",
        "TestOps::test_add_old_name",
        "TestOps::test_add_new_name",
    )
    assert drift.location.line == 6
    assert drift.to_json()["likely"] == "TestOps::test_add_new_name"
    with pytest.raises(SpecErrors) as strict:  # spec lint stays strict about the same spec
        check_against_upstream(spec)
    assert "likely renamed to 'TestOps::test_add_new_name'" in str(strict.value)


def test_no_drift_when_the_tree_has_everything(tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    (upstream / "test").mkdir(parents=True)
    (upstream / "test" / "test_ops.py").write_text(BEFORE)
    spec = load_specs([_spec(tmp_path)], upstream)
    assert find_drift(spec) == []
    check_against_upstream(spec)


def test_an_unresolvable_token_is_an_error_not_drift(tmp_path: Path) -> None:
    spec = load_specs([_spec(tmp_path)], None)  # no upstream tree: ${TORCH_ROOT} is unknown
    with pytest.raises(SpecErrors) as caught:
        find_drift(spec)
    assert "cannot resolve ${TORCH_ROOT}" in str(caught.value)


def test_the_relay_runs_a_drifted_spec_and_shows_the_drift(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "upstream")
    repo.commit("base", {"test/test_ops.py": BEFORE, "torch/ops.py": "x = 1\n"})
    repo.commit("rename a test", {"test/test_ops.py": AFTER, "torch/ops.py": "x = 2\n"})
    # the test's own upstream: running it unisolated is a person's choice, as the settings say
    rt = upstream_context(tmp_path, repo.path, SPEC.lstrip("\n"), runtime="local")
    steps: list[Next] = []
    with TestClient(create_app(rt, steps.extend)) as client:
        post_webhook(client, "pull_request", pull_request(repo, 7))
        drain(rt, steps)
        with rt.db.session() as s:
            run = s.scalars(select(Run)).one()
            plan = s.scalars(select(Selection).where(Selection.run_id == run.id)).one().plan
            facts = load_facts(s, run.id, with_failures=True)
            run_id, conclusion, counts = run.id, run.conclusion, dict(run.counts or {})
            errors = [run.error, *(sh.error for sh in run.shards)]
        page = client.get(f"/runs/{run_id}").text
        view = client.get(f"/api/runs/{run_id}/view").json()
    # the rest ran: the renamed test now follows unlisted_test_mode, and passes
    assert conclusion == "success", (conclusion, counts, errors)
    assert counts.get("passed") == 2
    (item,) = plan["spec_drift"]
    assert item["listed"] == "TestOps::test_add_old_name"
    assert item["likely"] == "TestOps::test_add_new_name"
    assert 'id="spec-drift"' in page and "Spec drift (1)" in page
    assert "TestOps::test_add_new_name" in page
    (shown,) = view["selection"]["spec_drift"]
    assert shown["line"] == 6 and shown["kind"] == "name"
    summary = output(facts, rt.settings, "completed")["summary"]
    assert "### Spec drift (1)" in summary
    assert "likely renamed to 'TestOps::test_add_new_name'" in summary
