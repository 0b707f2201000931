"""The nightly: once a day the upstream branch head runs and reports as CRCR's nightly
(``event_type: nightly``, the sha as the delivery id), from the reconciler's clock."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from ci_relay.context import RelayContext
from ci_relay.reporting.build import load_facts, render_callback
from ci_relay.reporting.wire import MAX_SEND_BYTES
from ci_relay.sample_upstream import SampleUpstream
from ci_relay.service import tasks
from ci_relay.store.models import Change, Delivery, Run, Selection
from tests.conftest import CliResult
from tests.gitrepo import GitRepo
from tests.relay_fixtures import drain, upstream_context

SPEC = """\
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_view_ops.py
      unlisted_test_mode: mandatory_success
"""
DAY = datetime(2026, 11, 30, tzinfo=UTC)


def _relay(sample: SampleUpstream, tmp_path: Path, **extra: object) -> tuple[GitRepo, RelayContext]:
    subprocess.run(["git", "clone", "-q", str(sample.path), str(tmp_path / "upstream")], check=True)
    repo = GitRepo(tmp_path / "upstream")
    # the test's own upstream: running it unisolated is a person's choice, as the settings say
    rt = upstream_context(
        tmp_path,
        repo.path,
        SPEC,
        runtime="local",
        nightly_repository="sample/pytorch",
        crcr_callback_url="http://127.0.0.1:9/crcr",
        **extra,
    )
    return repo, rt


def _newest_change(rt: RelayContext) -> tuple[Change, Run, dict[str, object]]:
    with rt.db.session() as s:
        change = s.scalars(select(Change).order_by(Change.id.desc())).first()
        assert change is not None
        run = change.runs[0]
        plan = s.scalars(select(Selection).where(Selection.run_id == run.id)).one().plan
        s.expunge_all()
    return change, run, plan


def test_the_nightly_runs_once_a_day_and_reports_as_crcr_expects(
    sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    repo, rt = _relay(sample_upstream, tmp_path, nightly_at="03:00", selection_budget="1")
    from ci_relay.nightly import nightly_steps

    assert nightly_steps(rt, DAY.replace(hour=2, minute=59)) == []  # not yet
    steps = nightly_steps(rt, DAY.replace(hour=3, minute=1))
    assert [s.task for s in steps] == ["process"]
    drain(rt, steps)
    head = repo.git("rev-parse", "HEAD")
    change, run, plan = _newest_change(rt)
    assert (change.kind, change.head_sha, change.base_sha) == ("nightly", head, None)
    assert run.conclusion == "success" and plan["budget"] == "all"  # the first: everything
    with rt.db.session() as s:
        body = json.loads(
            render_callback(load_facts(s, run.id, True), rt.settings, "completed", MAX_SEND_BYTES)
        )
    assert (body["event_type"], body["delivery_id"]) == ("nightly", head)
    assert body["workflow"]["status"] == "completed"

    assert nightly_steps(rt, DAY.replace(hour=23)) == []  # today's has run
    assert nightly_steps(rt, DAY + timedelta(days=1, hours=4)) == []  # the branch did not move

    newer = repo.commit("view: another test", {"README.md": "moved\n"})
    steps = nightly_steps(rt, DAY + timedelta(days=2, hours=4))
    drain(rt, steps)
    change, run, plan = _newest_change(rt)
    assert (change.head_sha, change.base_sha) == (newer, head)  # the range since the last one
    assert plan["budget"] == "1 tests" and plan["base"] == head


def test_the_scope_all_always_runs_the_universe(
    sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    repo, rt = _relay(sample_upstream, tmp_path, nightly_at="03:00", nightly_scope="all")
    from ci_relay.nightly import nightly_steps

    drain(rt, nightly_steps(rt, DAY.replace(hour=4)))
    repo.commit("more", {"README.md": "more\n"})
    drain(rt, nightly_steps(rt, DAY.replace(hour=4) + timedelta(days=1)))
    change, _run, plan = _newest_change(rt)
    assert change.base_sha is None and plan["budget"] == "all"


def test_the_reconcilers_clock_starts_it(sample_upstream: SampleUpstream, tmp_path: Path) -> None:
    _repo, rt = _relay(sample_upstream, tmp_path, nightly_at="00:00")
    tasks.configure(rt.settings)
    try:
        assert tasks.reconcile_once() >= 1
        assert tasks.reconcile_once() == 0  # started once a day, whichever clock asks
    finally:
        tasks.configure(tasks.Settings())
    with rt.db.session() as s:
        (delivery,) = s.scalars(select(Delivery).where(Delivery.hook_id == "nightly"))
        assert delivery.event == "nightly" and delivery.delivery_id == delivery.head_sha
    assert len(list((rt.settings.broker_folder / "queue").iterdir())) == 1  # its process step


def test_a_bad_branch_starts_nothing(sample_upstream: SampleUpstream, tmp_path: Path) -> None:
    from ci_relay.nightly import nightly_steps

    _repo, rt = _relay(sample_upstream, tmp_path, nightly_at="03:00", nightly_branch="no-such")
    assert nightly_steps(rt, DAY.replace(hour=4)) == []
    with rt.db.session() as s:
        assert s.scalars(select(Delivery)).first() is None
    (tmp_path / "other").mkdir()
    plain = upstream_context(tmp_path / "other", rt.settings.data_dir, SPEC)
    with pytest.raises(ValueError, match="no nightly is configured"):
        nightly_steps(plain, force=True)


def test_the_command_refuses_without_a_nightly_configured(cli: Callable[..., CliResult]) -> None:
    result = cli("nightly")
    assert result.code == 2 and "no nightly is configured" in result.stderr
