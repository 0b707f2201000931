"""Recovering a run (issue 56, item 4): ``POST /api/runs/{id}/rerun`` behind the dispatch
token queues a failed or errored run again as the next attempt of the same change and
backend, and the pipeline runs the first run's plan again (whole, or its failed shards)
instead of selecting anew; ``ci-relay rerun`` asks a served relay for the same. Every
refusal says why and adds nothing. Through the real app on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import Change, Delivery, Run, Selection, Shard
from tests.conftest import CliResult
from tests.relay_fixtures import DISPATCH_TOKEN, Relay, make_settings, served_app

AUTH = {"Authorization": f"Bearer {DISPATCH_TOKEN}"}
HEAD = "c" * 40
PASSING = ["test/test_a.py::TestA::test_one", "test/test_a.py::TestA::test_two"]
FAILING = ["test/test_b.py::TestB::test_three"]


def _failed_run(
    relay: Relay,
    state: str = "completed",
    conclusion: str | None = "failure",
    with_plan: bool = True,
) -> int:
    """A run of two shards, the second of which failed (exit 1), with its stored plan."""
    with relay.rt.db.session() as session:
        delivery = Delivery(
            source="github", hook_id="1", delivery_id=f"d-{state}-{conclusion}-{with_plan}",
            event="pull_request", action="synchronize", repository="sample/pytorch",
            head_sha=HEAD, state="processed", body=b"{}",
        )  # fmt: skip
        change = Change(
            delivery=delivery, repository="sample/pytorch", kind="pull_request", number=7,
            ref="pr-7", base_sha="b" * 40, head_sha=HEAD,
        )  # fmt: skip
        run = Run(change=change, backend="cpu", attempt=1, level="L2", state=state)
        run.conclusion = conclusion
        session.add(run)
        if with_plan:
            selected = [{"test": t, "shard": 0} for t in PASSING]
            selected += [{"test": t, "shard": 1} for t in FAILING]
            plan = {"selected": selected, "shards": [PASSING, FAILING], "notes": ["chosen"]}
            session.add(Selection(run=run, strategy="four-stage/none", plan=plan))
            session.add(Shard(run=run, index=0, test_files=PASSING, state="done", exit_code=0))
            session.add(Shard(run=run, index=1, test_files=FAILING, state="done", exit_code=1))
        session.flush()
        return run.id


def _runs(relay: Relay) -> int:
    with relay.rt.db.session() as session:
        return session.scalar(select(func.count()).select_from(Run)) or 0


def _select(relay: Relay, run_id: int) -> list[Next]:
    return pipeline.select_tests(relay.rt, run_id, timedelta(hours=1))


def _stored(relay: Relay, run_id: int) -> tuple[Any, list[list[str]], dict[str, Any]]:
    with relay.rt.db.session() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.selection is not None
        shards = [list(s.test_files) for s in run.shards]
        from ci_relay.service.api import run_json

        return run.selection.plan, shards, run_json(run)


def test_a_failed_run_runs_its_plan_again_as_the_next_attempt(relay: Relay) -> None:
    first = _failed_run(relay)
    response = relay.client.post(f"/api/runs/{first}/rerun", headers=AUTH)
    assert response.status_code == 202, response.text
    got = response.json()
    assert (got["attempt"], got["rerun_of"], got["scope"], got["state"]) == (
        2, first, "all", "pending",
    )  # fmt: skip
    assert got["url"] == f"/runs/{got['id']}"
    assert relay.enqueued[-1] == Next("select", got["id"])
    # the pipeline takes the first run's plan: the same shards, no new selection
    steps = _select(relay, got["id"])
    assert sorted(s.task for s in steps if s.task == "execute") == ["execute", "execute"]
    plan, shards, detail = _stored(relay, got["id"])
    assert shards == [PASSING, FAILING]
    assert plan["rerun"] == {"of": first, "scope": "all", "attempt": 2}
    assert plan["notes"][0] == (
        f"run {first} (attempt 1) queued again by hand: its plan run again, not selected anew"
    )
    assert (detail["attempt"], detail["rerun_of"], detail["rerun_scope"]) == (2, first, "all")
    api = relay.client.get(f"/api/runs/{got['id']}").json()
    assert (api["change_id"], api["backend"], api["rerun_of"]) == (
        detail["change_id"],
        "cpu",
        first,
    )
    # while it is under way, the same run is not queued twice
    again = relay.client.post(f"/api/runs/{first}/rerun", headers=AUTH)
    assert again.status_code == 409
    assert again.json()["error"] == (
        f"run {first} is already queued again as run {got['id']} (attempt 2, running)"
    )


def test_failed_only_runs_the_failed_shards_again(relay: Relay) -> None:
    first = _failed_run(relay, conclusion="error")
    response = relay.client.post(
        f"/api/runs/{first}/rerun", headers=AUTH, json={"failed_only": True}
    )
    assert response.status_code == 202, response.text
    assert response.json()["scope"] == "failed"
    steps = _select(relay, response.json()["id"])
    assert [s.task for s in steps].count("execute") == 1
    plan, shards, _detail = _stored(relay, response.json()["id"])
    assert shards == [FAILING]
    assert [t["test"] for t in plan["selected"]] == FAILING
    assert "its failed shards run again" in plan["notes"][0]


@pytest.mark.parametrize(
    ("make", "body", "headers", "status", "reason"),
    [
        (None, None, AUTH, 404, "no run 999999"),
        ("failed", None, {}, 401, "bad bearer token"),
        ("failed", None, {"Authorization": "Bearer wrong"}, 401, "bad bearer token"),
        ("running", None, AUTH, 409, "is running: a run is queued again once it has finished"),
        ("passed", None, AUTH, 409, "passed (success): nothing to recover"),
        ("no-plan", {"failed_only": True}, AUTH, 409, "has no failed shard to run again"),
        ("failed", b"{not json", AUTH, 400, "body is not JSON"),
        ("failed", {"failed_only": True, "all": 1}, AUTH, 422, "all"),
        ("failed", {"failed_only": "sometimes"}, AUTH, 422, "failed_only"),
    ],
)
def test_a_rerun_that_cannot_be_is_refused_with_why_and_adds_nothing(
    relay: Relay,
    make: str | None,
    body: Any,
    headers: dict[str, str],
    status: int,
    reason: str,
) -> None:
    made = {
        None: lambda: 999999,
        "failed": lambda: _failed_run(relay),
        "running": lambda: _failed_run(relay, state="running", conclusion=None),
        "passed": lambda: _failed_run(relay, conclusion="success"),
        "no-plan": lambda: _failed_run(relay, conclusion="error", with_plan=False),
    }[make]()
    before = _runs(relay)
    kwargs: dict[str, Any] = {"headers": headers}
    if isinstance(body, bytes):
        kwargs["content"] = body
    elif body is not None:
        kwargs["json"] = body
    response = relay.client.post(f"/api/runs/{made}/rerun", **kwargs)
    assert response.status_code == status, response.text
    assert reason in response.json()["error"], response.json()
    assert _runs(relay) == before
    assert not any(step.task == "select" for step in relay.enqueued)


def test_a_run_whose_selection_failed_is_selected_anew(relay: Relay) -> None:
    first = _failed_run(relay, conclusion="error", with_plan=False)
    response = relay.client.post(f"/api/runs/{first}/rerun", headers=AUTH)
    assert response.status_code == 202 and response.json()["scope"] == "all"
    with relay.rt.db.session() as session:
        again = session.get(Run, response.json()["id"])
        assert again is not None
        from ci_relay.pipeline.select import _rerun_plan

        assert _rerun_plan(session, again) is None  # no plan to repeat: the selector runs


@pytest.fixture
def sqlite_relay(tmp_path: Path) -> Iterator[Relay]:
    """The relay on SQLite alone: what the CLI and the browser see does not depend on the
    database (the API tests above run on both)."""
    rt = RelayContext(make_settings(f"sqlite:///{tmp_path / 'relay.db'}", tmp_path))
    rt.db.upgrade()
    enqueued: list[Next] = []
    with TestClient(create_app(rt, enqueued.extend)) as client:
        yield Relay(rt, client, enqueued)
    rt.db.dispose()


def test_the_cli_asks_a_served_relay_and_says_what_it_answered(
    sqlite_relay: Relay, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    relay = sqlite_relay
    first = _failed_run(relay)
    monkeypatch.setenv("CI_RELAY_DISPATCH_TOKEN", DISPATCH_TOKEN)
    with served_app(relay.rt) as url:
        done = cli("rerun", str(first), "--relay", url, "--failed-only")
        assert done.code == 0, done.output
        assert f"run {first} queued again as run" in done.output
        assert "(attempt 2, failed shards)" in done.output
        refused = cli("rerun", str(first), "--relay", url)
        assert refused.code == 2
        assert "the relay refused the rerun (HTTP 409)" in refused.output
        assert "already queued again" in " ".join(refused.output.split())
        monkeypatch.setenv("CI_RELAY_DISPATCH_TOKEN", "wrong")
        denied = cli("rerun", str(first), "--relay", url)
        assert denied.code == 2 and "(HTTP 401): bad bearer token" in denied.output
    monkeypatch.delenv("CI_RELAY_DISPATCH_TOKEN")
    missing = cli("rerun", str(first), "--relay", "http://127.0.0.1:9")
    assert missing.code == 2 and "CI_RELAY_DISPATCH_TOKEN" in missing.output
    bad = cli("rerun", str(first), "--relay", "ftp://x")
    assert bad.code == 2 and "not an http(s) URL" in bad.output


def test_the_run_page_button_queues_a_failed_run_again_in_a_browser(sqlite_relay: Relay) -> None:
    relay = sqlite_relay
    from playwright.sync_api import expect, sync_playwright

    from tests.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS

    first = _failed_run(relay)
    passed = _failed_run(relay, conclusion="success")
    with served_app(relay.rt) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{url}/runs/{passed}")
        expect(page.locator("h1")).to_contain_text(f"Run {passed}")
        expect(page.locator("form.rerun")).to_have_count(0)  # nothing to recover
        page.goto(f"{url}/runs/{first}")
        form = page.locator("form.rerun")
        form.locator("input[name=token]").fill("wrong")
        form.locator("button").click()
        expect(form.locator(".rerun-result")).to_have_text("refused (HTTP 401): bad bearer token")
        form.locator("input[name=token]").fill(DISPATCH_TOKEN)
        form.locator("input[name=failed_only]").check()
        form.locator("button").click()
        page.wait_for_url(f"{url}/runs/*")
        expect(page.locator("h1")).to_contain_text("attempt 2")
        expect(page.locator(".rerun-of")).to_have_text(
            f"queued again by hand: rerun of run {first}, its failed shards"
        )
        expect(page.locator("form.rerun")).to_have_count(0)  # pending: not recoverable yet
        page.locator(".rerun-of a").click()
        expect(page.locator("h1")).to_contain_text(f"Run {first}")
        browser.close()
    assert _runs(relay) == 3


def test_a_rerun_reports_the_same_job_s_next_attempt(relay: Relay) -> None:
    import json

    from ci_relay.reporting.build import load_facts, render_callback

    first = _failed_run(relay)
    one = relay.client.post(f"/api/runs/{first}/rerun", headers=AUTH).json()
    _select(relay, one["id"])
    with relay.rt.db.session() as session:  # the second attempt failed too: a third
        second = session.get(Run, one["id"])
        assert second is not None
        second.state, second.conclusion = "completed", "failure"
        for shard in second.shards:
            shard.state, shard.exit_code = "done", 1
    two = relay.client.post(f"/api/runs/{one['id']}/rerun", headers=AUTH).json()
    assert two["attempt"] == 3
    settings = relay.rt.settings
    with relay.rt.db.session() as session:
        sent = {
            run: json.loads(
                render_callback(load_facts(session, run, True), settings, "completed", 1 << 20)
            )["workflow"]
            for run in (first, one["id"], two["id"])
        }
    # one job: the first attempt's run id throughout, a check run and attempt number each
    assert [w["run_id"] for w in sent.values()] == [first] * 3
    assert [w["run_attempt"] for w in sent.values()] == [1, 2, 3]
    assert [w["check_run_id"] for w in sent.values()] == [first, one["id"], two["id"]]
    assert len({w["job_name"] for w in sent.values()}) == 1
