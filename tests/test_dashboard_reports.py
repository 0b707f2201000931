"""The run page's Reports section: outbox rows as the real sender left them, SQLite and PostgreSQL.

A CRCR receiver on loopback answers 500 forever and a HUD receiver accepts: the real
sender tries both, and the page (and its JSON twin) must show the stuck report's
attempts, next attempt and last error (escaped), and the sent one's time.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.dashboard.templating import when_s
from ci_relay.reporting import sender
from ci_relay.store.models import OutboxMessage
from tests.relay_fixtures import Relay, make_settings
from tests.reporting_fakes import CallbackReceiver, HudReceiver, seed_run
from tests.test_dashboard import text_of

CALLBACK_TOKEN = "crcr-token"
HUD_TOKEN = "hud-token"
EVIL = "<script>alert('x')</script>"


def aware(value: datetime) -> datetime:
    """SQLite hands datetimes back without a zone; every stored time is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _row(page: str, report_id: int) -> str:
    found = re.search(rf'<tr id="report-{report_id}".*?</tr>', page, re.S)
    assert found, f"no row for report {report_id}"
    return found.group(0)


def test_a_report_stuck_on_500_shows_its_attempts_and_last_error(
    relay: Relay, database_url: str, tmp_path: Path
) -> None:
    callback, hud = CallbackReceiver(CALLBACK_TOKEN), HudReceiver(HUD_TOKEN)
    callback.fail_forever(500, {"message": f"database on fire {EVIL}"})
    with callback.running() as cb_url, hud.running() as hud_url:
        rt = RelayContext(
            make_settings(
                database_url,
                tmp_path,
                crcr_callback_url=cb_url + "/callback",
                crcr_callback_token=CALLBACK_TOKEN,
                hud_url=hud_url + "/crcr/results",
                hud_upload_token=HUD_TOKEN,
                downstream_repo="ibm/torch-spyre",
                report_retry_base_seconds=10,
            )
        )
        try:
            run_id = seed_run(rt)
            crcr_id, hud_id = [
                step.arg for step in pipeline.collect(rt, run_id) if step.task == "report"
            ]
            assert sender.deliver(rt, hud_id).state == "sent"
            now = datetime.now(UTC)
            for _ in range(3):
                attempt = sender.deliver(rt, crcr_id, now=now)
                assert attempt.state == "pending" and attempt.retry_in is not None
                now += timedelta(seconds=attempt.retry_in)
            with rt.db.session() as s:
                rows = {r.target: r for r in s.scalars(select(OutboxMessage))}
        finally:
            rt.db.dispose()
    assert len(callback.posts()) == 3 and len(hud.records) == 1
    stuck, sent = rows["crcr"], rows["hud"]
    assert stuck.state == "pending" and stuck.attempts == 3 and stuck.last_error

    page = relay.client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    body = page.text
    assert "Reports (2)" in text_of(body)
    row = _row(body, crcr_id)
    assert 'data-target="crcr" data-state="pending"' in row
    cells = [text_of(c) for c in re.findall(r"<td.*?</td>", row, re.S)]
    assert cells[:5] == ["crcr", "completed", "pending", "3", when_s(stuck.next_attempt_at)]
    assert cells[5] == "—"  # never sent
    assert cells[6].startswith("HTTP 500 from POST ") and "database on fire" in cells[6]
    assert EVIL not in body and "&lt;script&gt;alert(" in row  # the answer is escaped
    sent_row = [text_of(c) for c in re.findall(r"<td.*?</td>", _row(body, hud_id), re.S)]
    assert sent_row[:4] == ["hud", "completed", "sent", "1"]
    assert sent_row[4] == "—" and sent_row[5] == when_s(sent.sent_at) and sent_row[6] == "—"

    reports = relay.client.get(f"/api/runs/{run_id}/view").json()["reports"]
    assert [(r["id"], r["target"], r["state"], r["attempts"]) for r in reports] == [
        (crcr_id, "crcr", "pending", 3),
        (hud_id, "hud", "sent", 1),
    ]
    assert reports[0]["last_error"] == stuck.last_error
    assert reports[0]["event"] == "completed" and reports[0]["sent_at"] is None
    shown = datetime.fromisoformat(reports[0]["next_attempt_at"])
    assert aware(shown) == aware(stuck.next_attempt_at)
    assert reports[1]["next_attempt_at"] is None and reports[1]["sent_at"] is not None


def test_a_run_without_report_targets_says_so(relay: Relay) -> None:
    run_id = seed_run(relay.rt)
    steps = pipeline.collect(relay.rt, run_id)
    assert [s.task for s in steps] == [
        "triage"
    ]  # no report target configured; its failure is triaged
    text = text_of(relay.client.get(f"/runs/{run_id}").text)
    assert "Reports (0)" in text and "no target" in text
    assert relay.client.get(f"/api/runs/{run_id}/view").json()["reports"] == []
