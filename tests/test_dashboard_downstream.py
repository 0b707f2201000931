"""Other relays' results on the grid: HUD bodies posted over real HTTP, SQLite and PostgreSQL.

The relay runs under uvicorn on loopback; two other relays post their results for a
commit the relay also ran itself, a third posts for a commit only it tested. The grid's
row for the shared commit must show our backend's column and both of theirs, coloured
by status and conclusion with their counts, each linked to the record's own page.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.service.app import create_app
from ci_relay.store.models import Change, Run
from tests.relay_fixtures import make_settings
from tests.reporting_fakes import seed_run
from tests.test_dashboard import text_of

TOKEN = "hud-ingest-token"
EVIL = "<script>alert('x')</script>"
WIDGET = "acme/torch-widget: widget-ci / test (widget)"
XPU = "intel/torch-xpu: xpu-ci / test (xpu)"


def hud_body(
    relay: str,
    workflow_name: str,
    job: str,
    head: str,
    *,
    status: str = "completed",
    conclusion: str | None = "success",
    counts: dict[str, int] | None = None,
    failed: list[dict[str, Any]] | None = None,
    url: str = "https://ci.example.test/runs/9",
    check_run_id: int = 1,
) -> dict[str, Any]:
    workflow: dict[str, Any] = {
        "schema_version": "1",
        "status": status,
        "conclusion": conclusion,
        "name": workflow_name,
        "url": url,
        "run_id": 9,
        "run_attempt": 1,
        "job_name": job,
        "check_run_id": check_run_id,
        "started_at": "2026-01-01T00:00:00Z",
    }
    if status == "completed":
        workflow.update(
            completed_at="2026-01-01T00:05:00Z",
            test_results=counts or {"passed": 1, "failed": 0, "skipped": 0, "total": 1},
            failed_tests=failed or [],
        )
    return {
        "trusted": {
            "verified_repo": relay,
            "downstream_repo_level": "L2",
            "ci_metrics": {"queue_time": 4.0, "execution_time": 300.0},
        },
        "untrusted": {
            "callback_payload": {
                "event_type": "pull_request",
                "delivery_id": f"{relay}-{head[:8]}",
                "payload": {
                    "repository": {"full_name": "sample/pytorch"},
                    "pull_request": {"number": 7, "head": {"sha": head}},
                },
                "workflow": workflow,
            }
        },
    }


@dataclass
class Served:
    rt: RelayContext
    url: str

    def post(self, body: dict[str, Any]) -> int:
        response = httpx.post(
            f"{self.url}/api/crcr/results",
            json=body,
            headers={"x-hud-internal-bot": TOKEN},
            timeout=30,
        )
        assert response.status_code in (200, 201), response.text
        return int(response.json()["id"])

    def get(self, path: str, status: int = 200) -> httpx.Response:
        response = httpx.get(self.url + path, timeout=30)
        assert response.status_code == status, (path, response.text[:300])
        return response


@pytest.fixture
def served(database_url: str, tmp_path: Path) -> Iterator[Served]:
    rt = RelayContext(make_settings(database_url, tmp_path, hud_token=TOKEN))
    rt.db.upgrade()
    server = uvicorn.Server(
        uvicorn.Config(create_app(rt, lambda steps: None), host="127.0.0.1", port=0)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Served(rt, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(10)
        rt.db.dispose()


def _local_run(rt: RelayContext) -> tuple[int, str]:
    run_id = seed_run(rt, passed=4, failures=1)
    pipeline.collect(rt, run_id)
    with rt.db.session() as s:
        head = s.scalar(select(Change.head_sha).join(Run).where(Run.id == run_id))
    assert head is not None
    return run_id, head


def _grid_row(page: str, head: str) -> str:
    found = re.search(rf'<tr data-sha="{head}">.*?</tr>', page, re.S)
    assert found, f"no grid row for {head}"
    return found.group(0)


def test_the_grid_shows_other_relays_next_to_our_backend(served: Served) -> None:
    run_id, head = _local_run(served.rt)
    failure = {
        "name": "test/test_widget.py::TestWidget::test_add",
        "outcome": "failed",
        "message": f"AssertionError: widget {EVIL}",
        "stacktrace": "Traceback:\n  File test_widget.py, line 3\nAssertionError",
    }
    widget_id = served.post(
        hud_body(
            "acme/torch-widget",
            "widget-ci",
            "test (widget)",
            head,
            conclusion="failure",
            counts={"passed": 10, "failed": 1, "skipped": 2, "total": 13},
            failed=[failure],
            url="javascript:alert(1)",
        )
    )
    xpu_id = served.post(
        hud_body(
            "intel/torch-xpu", "xpu-ci", "test (xpu)", head, status="in_progress", conclusion=None
        )
    )
    only_theirs = "f" * 40  # a commit we never received, that another relay tested
    served.post(hud_body("intel/torch-xpu", "xpu-ci", "test (xpu)", only_theirs))

    data = served.get("/api/grid").json()
    assert data["backends"] == ["cpu"] and data["downstream"] == [WIDGET, XPU]
    rows = {r["head_sha"]: r for r in data["rows"]}
    assert set(rows) == {head, only_theirs}
    ours = rows[head]
    assert ours["cells"]["cpu"]["run_id"] == run_id and ours["cells"]["cpu"]["status"] == "failure"
    widget = ours["downstream"][WIDGET]
    assert widget["result_id"] == widget_id and widget["status"] == "failure"
    assert widget["counts"] == {"failed": 1, "passed": 10, "skipped": 2} and widget["total"] == 13
    assert ours["downstream"][XPU]["status"] == "running"
    assert ours["downstream"][XPU]["result_id"] == xpu_id
    assert (
        list(rows[only_theirs]["cells"]) == []
        and rows[only_theirs]["repository"] == "sample/pytorch"
    )
    assert rows[only_theirs]["downstream"][XPU]["status"] == "success"

    page = served.get("/").text
    row = _grid_row(page, head)
    assert f'href="/runs/{run_id}"' in row and 'data-backend="cpu" data-status="failure"' in row
    assert f'data-backend="{WIDGET}" data-status="failure"' in row
    assert f'href="/downstream/{widget_id}"' in row
    assert "1 fail" in text_of(row) and "10 pass" in text_of(row) and "2 skip" in text_of(row)
    assert f'data-backend="{XPU}" data-status="running"' in row
    assert f'href="/downstream/{xpu_id}"' in row
    assert 'class="cell downstream status-failure"' in row
    assert "acme/torch-widget" in page and "widget-ci / test (widget)" in page  # column heads
    assert 'class="cell status-none" data-backend="cpu"' in _grid_row(page, only_theirs)

    # the record's page: what the other relay said, escaped, its unsafe link dropped
    record = served.get(f"/downstream/{widget_id}").text
    assert "test/test_widget.py::TestWidget::test_add" in record
    assert "AssertionError: widget &lt;script&gt;" in record and EVIL not in record
    assert "File test_widget.py, line 3" in record
    assert "javascript:" not in record
    assert f'href="/commits/{head}"' in record
    as_json = served.get(f"/api/downstream/{widget_id}").json()
    assert as_json["cell"]["column"] == WIDGET and as_json["url"] is None
    assert as_json["failed_tests"][0]["message"] == f"AssertionError: widget {EVIL}"
    assert as_json["queue_time"] == 4.0 and as_json["head_sha"] == head
    served.get("/downstream/999999", 404)
    assert served.get("/api/downstream/999999", 404).json() == {
        "detail": "no result 999999 has been posted by another relay"
    }

    # the commit pages list them too, even for a commit only another relay tested
    assert "Other relays" in served.get(f"/commits/{head}").text
    theirs = served.get(f"/api/commits/{only_theirs[:12]}").json()
    assert theirs["heads"] == [] and [c["column"] for c in theirs["downstream"]] == [XPU]

    # a later post of the same job (HUD's key) moves the cell on
    served.post(hud_body("intel/torch-xpu", "xpu-ci", "test (xpu)", head))
    again = {r["head_sha"]: r for r in served.get("/api/grid").json()["rows"]}
    assert again[head]["downstream"][XPU]["status"] == "success"
    assert again[head]["downstream"][XPU]["result_id"] == xpu_id  # upserted, not added


def test_a_rerun_is_the_newest_record_of_its_job(served: Served) -> None:
    _, head = _local_run(served.rt)
    served.post(
        hud_body(
            "acme/torch-widget",
            "widget-ci",
            "test (widget)",
            head,
            conclusion="failure",
            check_run_id=1,
        )
    )
    rerun = served.post(
        hud_body(
            "acme/torch-widget",
            "widget-ci",
            "test (widget)",
            head,
            conclusion="cancelled",
            check_run_id=2,
        )
    )
    cell = served.get("/api/grid").json()["rows"][0]["downstream"][WIDGET]
    assert cell["result_id"] == rerun and cell["records"] == 2
    assert cell["status"] == "error" and cell["conclusion"] == "cancelled"
