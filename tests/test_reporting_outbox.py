"""Outbox reports to the CRCR callback and HUD, against loopback servers, on SQLite and PostgreSQL.

Runs are closed by the real ``pipeline.collect`` (which queues the reports) and sent by the
real sender; the receivers are HTTP servers on 127.0.0.1 that check the formats themselves.
Time is never waited for: a retry is made due by passing the sender the time it asked for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.reporting import sender
from ci_relay.reporting.outbox import enqueue_reports
from ci_relay.reporting.wire import MAX_SEND_BYTES
from ci_relay.store.models import OutboxMessage, Run, TestResult
from tests.relay_fixtures import make_settings
from tests.reporting_fakes import (
    CallbackReceiver,
    HudReceiver,
    closed_port_url,
    seed_run,
    wait_for,
)

HUD_TOKEN = "hud-bot-token-for-tests"
CALLBACK_TOKEN = "crcr-callback-token"
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def make_rt(database_url: str, tmp_path: Path) -> Iterator[Any]:
    """Runtimes on one database with report settings; each is like a separate process."""
    made: list[RelayContext] = []

    def make(**settings: Any) -> RelayContext:
        rt = RelayContext(make_settings(database_url, tmp_path, **settings))
        rt.db.upgrade()
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.db.dispose()


def report_settings(callback: str | None = None, hud: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"public_url": "https://relay.example", "report_retry_base_seconds": 10}
    if callback:
        out.update(crcr_callback_url=callback + "/callback", crcr_callback_token=CALLBACK_TOKEN)
    if hud:
        out.update(
            hud_url=hud + "/crcr/results",
            hud_upload_token=HUD_TOKEN,
            downstream_repo="ibm/torch-spyre",
        )
    return out


def message(rt: RelayContext, message_id: int) -> OutboxMessage:
    with rt.db.session() as s:
        row = s.get(OutboxMessage, message_id)
        assert row is not None
        return row


def aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def collect_reports(rt: RelayContext, run_id: int) -> list[int]:
    steps = pipeline.collect(rt, run_id)
    # the reports first; a run with failures then queues its triage (tests/test_triage.py)
    assert [s.task for s in steps if s.task != "report"] in ([], ["triage"])
    assert all(s.task == "report" for s in steps[: len(steps) - 1])
    return [step.arg for step in steps if step.task == "report"]


def test_a_run_reports_in_progress_then_completed_to_crcr_and_hud(make_rt: Any) -> None:
    callback, hud = CallbackReceiver(CALLBACK_TOKEN), HudReceiver(HUD_TOKEN)
    with callback.running() as cb_url, hud.running() as hud_url:
        rt = make_rt(**report_settings(cb_url, hud_url))
        run_id = seed_run(rt, passed=5, failures=2)
        with rt.db.session() as s:
            run = s.get(Run, run_id)
            assert run is not None
            started = enqueue_reports(s, rt, run, "in_progress")
        assert [sender.deliver(rt, i).state for i in started] == ["sent", "sent"]
        completed = collect_reports(rt, run_id)
        assert len(completed) == 2
        assert [sender.deliver(rt, i).state for i in completed] == ["sent", "sent"]

    assert [a["workflow"]["status"] for a in callback.accepted] == ["in_progress", "completed"]
    done = callback.accepted[1]["workflow"]
    assert done["conclusion"] == "failure"
    assert done["test_results"] == {"passed": 5, "failed": 2, "skipped": 0, "total": 7}
    assert [t["name"] for t in done["failed_tests"]] == [
        "test/test_ops.py::TestOpsCPU::test_bad_0",
        "test/test_ops.py::TestOpsCPU::test_bad_1",
    ]
    assert done["artifact_url"] == f"https://relay.example/api/runs/{run_id}"
    assert callback.accepted[1]["payload"]["pull_request"]["number"] == 7
    # HUD keeps one record per key: the completed report replaced the in_progress one
    assert len(hud.sizes) == 2 and len(hud.records) == 1
    (key, record) = next(iter(hud.records.items()))
    assert (
        key == f"ibm/torch-spyre/{callback.accepted[0]['delivery_id']}/ci-relay/test (cpu)/{run_id}"
    )
    assert record["trusted"]["downstream_repo_level"] == "L2"
    assert record["trusted"]["ci_metrics"]["queue_time"] == pytest.approx(20, abs=1)
    assert record["untrusted"]["callback_payload"]["workflow"]["status"] == "completed"
    for i in started + completed:
        row = message(rt, i)
        assert (row.state, row.attempts, row.last_error) == ("sent", 1, None)
        assert row.sent_at is not None and row.result and row.result["status"] == 200


def test_hud_report_is_accepted_by_another_relays_ingest(
    make_rt: Any, database_url: str, tmp_path: Path
) -> None:
    """Our HUD body, posted over real HTTP to a second relay's ``/api/crcr/results``."""
    import time

    import httpx
    import uvicorn

    from ci_relay.service.app import create_app

    other = RelayContext(
        make_settings(f"sqlite:///{tmp_path / 'other.db'}", tmp_path, hud_token=HUD_TOKEN)
    )
    other.db.upgrade()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(other, lambda steps: None), host="127.0.0.1", port=0, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        rt = make_rt(**report_settings(hud=f"http://127.0.0.1:{port}/api"))
        run_id = seed_run(rt, failures=3)
        (report,) = collect_reports(rt, run_id)
        attempt = sender.deliver(rt, report)
        assert attempt.state == "sent", attempt.error
        listed = httpx.get(
            f"http://127.0.0.1:{port}/api/crcr/results", params={"repo": "ibm/torch-spyre"}
        ).json()
        assert len(listed) == 1
        assert listed[0]["status"] == "completed" and listed[0]["conclusion"] == "failure"
        assert listed[0]["workflow"]["test_results"]["failed"] == 3
        assert listed[0]["upstream_repo"] == "sample/pytorch"
    finally:
        server.should_exit = True
        thread.join(10)
        other.db.dispose()


def test_an_endpoint_answering_500_forever_never_loses_the_message(make_rt: Any) -> None:
    callback = CallbackReceiver(CALLBACK_TOKEN)
    callback.fail_forever(500, {"message": "database on fire"})
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        (report,) = collect_reports(rt, seed_run(rt))
        now = datetime.now(UTC)
        gaps = []
        for attempt_no in range(1, 7):
            attempt = sender.deliver(rt, report, now=now)
            row = message(rt, report)
            assert attempt.state == "pending" and row.state == "pending"
            assert row.attempts == attempt_no
            assert row.sent_at is None
            assert row.last_error is not None
            assert "HTTP 500" in row.last_error and "database on fire" in row.last_error
            due = aware(row.next_attempt_at)
            assert due > now
            gaps.append((due - now).total_seconds())
            # not due before its time: a sender passing by earlier leaves it alone
            assert sender.deliver(rt, report, now=due - timedelta(seconds=1)).state is None
            now = due
        assert len(callback.posts()) == 6
    assert all(later > earlier for earlier, later in pairwise(gaps))  # backoff grows
    assert gaps[0] >= 10  # the configured base


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_in_seconds_is_honoured(make_rt: Any, status: int) -> None:
    callback = CallbackReceiver(CALLBACK_TOKEN)
    callback.script(status, {"retry-after": "120"}, {"message": "slow down"})
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        (report,) = collect_reports(rt, seed_run(rt))
        now = datetime.now(UTC)
        attempt = sender.deliver(rt, report, now=now)
        row = message(rt, report)
        assert attempt.state == "pending" and f"HTTP {status}" in (row.last_error or "")
        assert aware(row.next_attempt_at) == now + timedelta(seconds=120)
        assert sender.deliver(rt, report, now=now + timedelta(seconds=119)).state is None
        assert sender.deliver(rt, report, now=now + timedelta(seconds=120)).state == "sent"
    assert message(rt, report).attempts == 2


def test_retry_after_as_an_http_date_is_honoured(make_rt: Any) -> None:
    callback = CallbackReceiver(CALLBACK_TOKEN)
    when = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    callback.script(503, {"retry-after": format_datetime(when, usegmt=True)})
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        (report,) = collect_reports(rt, seed_run(rt))
        sender.deliver(rt, report)
        assert aware(message(rt, report).next_attempt_at) == when
        assert sender.deliver(rt, report, now=when).state == "sent"


@pytest.mark.parametrize(
    ("status", "final"), [(400, "failed"), (404, "failed"), (422, "failed"), (408, "pending")]
)
def test_a_4xx_stops_the_message_with_the_answer_in_last_error(
    make_rt: Any, status: int, final: str
) -> None:
    callback = CallbackReceiver(CALLBACK_TOKEN)
    callback.script(status, body={"message": "workflow.status: bad value"})
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        (report,) = collect_reports(rt, seed_run(rt))
        attempt = sender.deliver(rt, report)
        row = message(rt, report)
        assert attempt.state == final == row.state
        assert f"HTTP {status} from POST {url}/callback" in (row.last_error or "")
        assert "workflow.status: bad value" in (row.last_error or "")
        if final == "failed":  # never picked up again, whatever the time
            later = datetime.now(UTC) + timedelta(days=30)
            assert sender.deliver_due(rt, now=later) == []
            assert len(callback.posts()) == 1


def test_a_payload_the_receiver_rejects_fails_visibly(make_rt: Any) -> None:
    """The wrong token: the receiver's 401 is our configuration's fault, not a reason to retry."""
    callback = CallbackReceiver("another-token")
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        (report,) = collect_reports(rt, seed_run(rt))
        assert sender.deliver(rt, report).state == "failed"
        assert "HTTP 401" in (message(rt, report).last_error or "")


def test_connection_refused_is_retried_and_sent_once_the_target_is_up(make_rt: Any) -> None:
    refused = closed_port_url()
    rt = make_rt(crcr_callback_url=refused, report_retry_base_seconds=10)
    (report,) = collect_reports(rt, seed_run(rt))
    for expected in (1, 2):
        attempt = sender.deliver(rt, report, now=aware(message(rt, report).next_attempt_at))
        row = message(rt, report)
        assert attempt.state == "pending" and row.attempts == expected
        assert "ConnectError" in (row.last_error or "")
    callback = CallbackReceiver(CALLBACK_TOKEN)
    with callback.running() as url:  # the operator fixes the URL and restarts the worker
        fixed = make_rt(**report_settings(url))
        (attempt,) = sender.deliver_due(fixed, now=aware(message(rt, report).next_attempt_at))
    assert attempt.state == "sent" and len(callback.accepted) == 1
    assert message(rt, report).attempts == 3


def _child_env(rt: RelayContext) -> dict[str, str]:
    s = rt.settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("CI_RELAY_")}
    env.update(
        CI_RELAY_DATABASE_URL=s.effective_database_url,
        CI_RELAY_DATA_DIR=str(s.data_dir),
        CI_RELAY_POLICY_FILE=str(s.policy_file),
        CI_RELAY_CRCR_CALLBACK_URL=str(s.crcr_callback_url),
        CI_RELAY_CRCR_CALLBACK_TOKEN=CALLBACK_TOKEN,
        PYTHONPATH=str(REPO_ROOT),
    )
    return env


CHILD = """
import sys
from datetime import datetime
from ci_relay.reporting import sender
from ci_relay.context import RelayContext
from ci_relay.settings import Settings
attempts = sender.deliver_due(RelayContext(Settings()), now=datetime.fromisoformat(sys.argv[1]))
print(",".join(f"{a.message_id}:{a.state}" for a in attempts), flush=True)
"""


def test_a_new_process_sends_what_the_old_one_left_pending(make_rt: Any) -> None:
    callback = CallbackReceiver(CALLBACK_TOKEN)
    callback.script(500, times=2)
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        first, second = (collect_reports(rt, seed_run(rt))[0] for _ in range(2))
        for report in (first, second):
            assert sender.deliver(rt, report).state == "pending"
        rt.db.dispose()  # this "process" is gone; only the rows remain
        due = max(aware(message(rt, i).next_attempt_at) for i in (first, second))
        child = subprocess.run(
            [sys.executable, "-c", CHILD, due.isoformat()],
            env=_child_env(rt),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == f"{first}:sent,{second}:sent"
    assert len(callback.accepted) == 2
    assert [message(rt, i).state for i in (first, second)] == ["sent", "sent"]


def test_a_sender_killed_mid_send_leaves_the_row_for_the_next_one(make_rt: Any) -> None:
    callback = CallbackReceiver(CALLBACK_TOKEN)
    callback.hold = threading.Event()  # the request arrives, the answer never comes
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        (report,) = collect_reports(rt, seed_run(rt))
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, datetime.now(UTC).isoformat()],
            env=_child_env(rt),
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            wait_for(callback.arrived, "the first sender's request")
            row = message(rt, report)
            assert (row.state, row.attempts) == ("sending", 1)
            # while its lease runs, nobody else sends it
            assert sender.deliver(rt, report).state is None
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
        callback.hold.set()
        lease_end = aware(message(rt, report).next_attempt_at)
        (attempt,) = sender.deliver_due(rt, now=lease_end)
    assert attempt.state == "sent"
    row = message(rt, report)
    assert (row.state, row.attempts) == ("sent", 2)


def test_reports_of_a_run_go_out_in_order(make_rt: Any) -> None:
    """While in_progress is in flight, completed waits; when it lands, completed is released."""
    callback = CallbackReceiver(CALLBACK_TOKEN)
    callback.hold = threading.Event()
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        run_id = seed_run(rt)
        with rt.db.session() as s:
            run = s.get(Run, run_id)
            assert run is not None
            (started,) = enqueue_reports(s, rt, run, "in_progress")
        results: list[sender.Attempt] = []
        thread = threading.Thread(target=lambda: results.append(sender.deliver(rt, started)))
        thread.start()
        wait_for(callback.arrived, "the in_progress report")
        (completed,) = collect_reports(rt, run_id)
        assert sender.deliver(rt, completed).state is None  # waits for the older report
        callback.hold.set()
        thread.join(60)
        assert results[0].state == "sent" and results[0].unblocked == [completed]
        assert sender.deliver(rt, completed).state == "sent"
    assert [a["workflow"]["status"] for a in callback.accepted] == ["in_progress", "completed"]


def test_a_pending_in_progress_is_superseded_by_the_completed_report(make_rt: Any) -> None:
    callback = CallbackReceiver(CALLBACK_TOKEN)
    callback.script(500)
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        run_id = seed_run(rt)
        with rt.db.session() as s:
            run = s.get(Run, run_id)
            assert run is not None
            (started,) = enqueue_reports(s, rt, run, "in_progress")
        assert sender.deliver(rt, started).state == "pending"
        (completed,) = collect_reports(rt, run_id)
        assert message(rt, started).state == "superseded"
        assert [a.state for a in sender.deliver_due(rt)] == ["sent"]
    assert [a["workflow"]["status"] for a in callback.accepted] == ["completed"]
    assert message(rt, completed).state == "sent"


def test_ten_thousand_failures_are_capped_in_reports_and_all_kept(make_rt: Any) -> None:
    callback, hud = CallbackReceiver(CALLBACK_TOKEN), HudReceiver(HUD_TOKEN)
    text = (
        "AssertionError: "
        + "é" * 3000
        + "\n"
        + "\n".join(f'  File "x.py", line {i}' for i in range(600))
    )
    with callback.running() as cb_url, hud.running() as hud_url:
        rt = make_rt(**report_settings(cb_url, hud_url))
        run_id = seed_run(rt, passed=10, failures=10_000, message=text)
        reports = collect_reports(rt, run_id)
        assert [sender.deliver(rt, i).state for i in reports] == ["sent", "sent"]
    (body,) = callback.accepted
    workflow = body["workflow"]
    assert workflow["test_results"] == {
        "passed": 10,
        "failed": 10_000,
        "skipped": 0,
        "total": 10_010,
    }
    listed = workflow["failed_tests"]
    assert len(listed) == 1000 and workflow["failed_tests_omitted"] == 9000
    assert all(len(t["message"].encode()) <= 1024 for t in listed)
    assert all(t["message"].endswith("…[truncated]") for t in listed)
    assert (
        len(json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()) <= MAX_SEND_BYTES
    )
    (hud_body,) = hud.records.values()
    assert hud.sizes[0] <= MAX_SEND_BYTES
    assert len(hud_body["untrusted"]["callback_payload"]["workflow"]["failed_tests"]) <= 1000
    with rt.db.session() as s:  # every failure is still ours to show
        stored = s.scalar(
            select(func.count()).select_from(TestResult).where(TestResult.outcome == "failed")
        )
    assert stored == 10_000


def test_stacktraces_are_cut_to_4_kb_keeping_head_and_tail(make_rt: Any) -> None:
    callback = CallbackReceiver(CALLBACK_TOKEN)
    text = "RuntimeError: boom\n" + "x" * 10_000 + "\nthe_last_frame.py:12: RuntimeError"
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        (report,) = collect_reports(rt, seed_run(rt, failures=5, message=text))
        assert sender.deliver(rt, report).state == "sent"
    listed = callback.accepted[0]["workflow"]["failed_tests"]
    assert [t["message"] for t in listed] == ["RuntimeError: boom"] * 5
    for entry in listed:
        stack = entry["stacktrace"]
        assert 3500 < len(stack.encode()) <= 4096
        assert stack.startswith("RuntimeError: boom\n")  # the test's end of the traceback
        assert stack.endswith("\nthe_last_frame.py:12: RuntimeError")  # and the error's
        assert "bytes cut]" in stack


def test_the_reconciler_finds_overdue_reports(make_rt: Any) -> None:
    rt = make_rt(crcr_callback_url=closed_port_url())
    (report,) = collect_reports(rt, seed_run(rt))
    assert sender.deliver(rt, report).state == "pending"
    with rt.db.session() as s:
        row = s.get(OutboxMessage, report)
        assert row is not None
        row.next_attempt_at = datetime.now(UTC) - timedelta(hours=1)
    steps = pipeline.reconcile(rt, older_than=timedelta(seconds=60), stale_after=timedelta(hours=4))
    assert [(n.task, n.arg) for n in steps if n.task == "report"] == [("report", report)]
    from fastapi.testclient import TestClient

    from ci_relay.service.app import create_app

    with TestClient(create_app(rt, lambda steps: None)) as client:
        assert 'ci_relay_pending{kind="reports"} 1.0' in client.get("/metrics").text


def test_no_target_configured_queues_nothing(make_rt: Any) -> None:
    rt = make_rt()
    assert collect_reports(rt, seed_run(rt)) == []
    with rt.db.session() as s:
        assert s.scalar(select(func.count()).select_from(OutboxMessage)) == 0


def test_the_celery_task_sends_and_queues_its_own_retry(make_rt: Any) -> None:
    """The task body as a worker runs it: a 503 leaves the row pending and puts a delayed
    ``relay.send_report`` on the (embedded) broker; the next run of the task sends it."""
    from ci_relay.service import tasks

    callback = CallbackReceiver(CALLBACK_TOKEN)
    callback.script(503, {"retry-after": "30"})
    with callback.running() as url:
        rt = make_rt(**report_settings(url))
        (report,) = collect_reports(rt, seed_run(rt))
        worker_rt = tasks.configure(rt.settings)
        try:
            tasks.send_report.run(report)
            assert message(rt, report).state == "pending"
            queued = [p.read_text() for p in (rt.settings.broker_folder / "queue").iterdir()]
            assert len(queued) == 1
            assert "relay.send_report" in queued[0] and '"eta"' in queued[0]
            with rt.db.session() as s:  # the 30 s have passed
                row = s.get(OutboxMessage, report)
                assert row is not None
                row.next_attempt_at = datetime.now(UTC) - timedelta(seconds=1)
            tasks.send_report.run(report)
        finally:
            worker_rt.db.dispose()
    assert message(rt, report).state == "sent" and len(callback.accepted) == 1


def test_each_thread_keeps_one_http_client(tmp_path: Path) -> None:
    """Making a client costs more than sending a report: a sender thread keeps its own."""
    settings = make_settings(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    mine = sender.thread_client(settings)
    assert sender.thread_client(settings) is mine
    other: list[Any] = []
    worker = threading.Thread(target=lambda: other.append(sender.thread_client(settings)))
    worker.start()
    worker.join()
    assert other[0] is not mine  # never shared between threads
    slower = make_settings(f"sqlite:///{tmp_path / 'r.db'}", tmp_path, report_timeout_seconds=99)
    replaced = sender.thread_client(slower)
    assert replaced is not mine and mine.is_closed and replaced.timeout.read == 99


def test_every_tasks_row_leads_back_to_its_delivery_for_the_logs(make_rt: Any) -> None:
    """``delivery_id_of`` walks each task's row (delivery, run, shard, outbox message) back
    to the delivery id the logs carry; an unknown row has none."""
    from ci_relay.store.models import Delivery, Shard

    callback = CallbackReceiver(CALLBACK_TOKEN)
    with callback.running() as cb_url:
        rt = make_rt(**report_settings(cb_url))
        run_id = seed_run(rt)
        with rt.db.session() as s:
            run = s.get(Run, run_id)
            assert run is not None
            message_id = enqueue_reports(s, rt, run, "in_progress")[0]
            delivery = s.scalars(select(Delivery)).one()
            shard_id = s.scalars(select(Shard.id).where(Shard.run_id == run_id)).one()
            expected, delivery_pk = delivery.delivery_id, delivery.id
    rows = {
        "process": delivery_pk,
        "select": run_id,
        "collect": run_id,
        "execute": shard_id,
        "report": message_id,
    }
    for task, pk in rows.items():
        assert pipeline.delivery_id_of(rt, task, pk) == expected, task
    assert pipeline.delivery_id_of(rt, "execute", shard_id + 1000) is None
