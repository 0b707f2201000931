"""``/api/crcr/results``: the real app over real HTTP (uvicorn on loopback), SQLite and PostgreSQL."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, inspect, select

from ci_relay.context import RelayContext
from ci_relay.service.app import create_app
from ci_relay.store.database import alembic_config
from ci_relay.store.models import AuditRecord, Base, CrcrResult
from tests.relay_fixtures import make_settings

TOKEN = "hud-ingest-token"
LIMIT = 2 * 1024 * 1024

BODY: dict[str, Any] = {
    "trusted": {
        "verified_repo": "acme/torch-widget",
        "downstream_repo_level": "L2",
        "ci_metrics": {"queue_time": 12.5, "execution_time": 300.0},
    },
    "untrusted": {
        "callback_payload": {
            "event_type": "pull_request",
            "delivery_id": "d-1",
            "payload": {
                "repository": {"full_name": "pytorch/pytorch"},
                "pull_request": {"number": 5, "head": {"sha": "a" * 40}},
            },
            "workflow": {
                "schema_version": "1",
                "status": "in_progress",
                "conclusion": None,
                "name": "widget-ci",
                "url": "https://ci.acme.test/runs/9",
                "run_id": 9,
                "run_attempt": 1,
                "job_name": "test (widget)",
                "check_run_id": 4242,
                "started_at": "2025-01-01T00:00:00Z",
                "artifact_url": None,
            },
        }
    },
}


def completed(body: dict[str, Any] | None = None) -> dict[str, Any]:
    out = copy.deepcopy(body or BODY)
    wf = out["untrusted"]["callback_payload"]["workflow"]
    wf.update(
        status="completed",
        conclusion="failure",
        completed_at="2025-01-01T00:05:00Z",
        test_results={"passed": 10, "failed": 1, "skipped": 2, "total": 13},
        failed_tests=[{"name": "test_x.py::T::test_y", "message": "boom"}],
    )
    return out


@dataclass
class Server:
    rt: RelayContext
    url: str

    def post(self, body: Any, token: str | None = TOKEN, **kwargs: Any) -> httpx.Response:
        headers = {"content-type": "application/json"}
        if token is not None:
            headers["x-hud-internal-bot"] = token
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(
            f"{self.url}/api/crcr/results", content=content, headers=headers, timeout=60, **kwargs
        )

    def rows(self) -> list[CrcrResult]:
        with self.rt.db.session() as s:
            return list(s.scalars(select(CrcrResult).order_by(CrcrResult.id)))


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[Server]:
    rt = RelayContext(make_settings(database_url, tmp_path, hud_token=TOKEN))
    rt.db.upgrade()
    app = create_app(rt, lambda steps: None)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        yield Server(rt, f"http://127.0.0.1:{port}")
    finally:
        srv.should_exit = True
        thread.join(10)
        rt.db.dispose()


def test_a_result_is_stored_then_upserted_on_the_hud_key(server: Server) -> None:
    first = server.post(BODY)
    assert first.status_code == 201, first.text
    key = "acme/torch-widget/d-1/widget-ci/test (widget)/4242"
    assert first.json()["key"] == key and first.json()["created"] is True
    final = json.dumps(completed()).encode()
    second = server.post(final)
    assert second.status_code == 200 and second.json() == {
        "id": first.json()["id"],
        "key": key,
        "created": False,
        "updated": True,
    }
    (row,) = server.rows()
    assert (row.status, row.conclusion, row.head_sha, row.upstream_repo) == (
        "completed",
        "failure",
        "a" * 40,
        "pytorch/pytorch",
    )
    assert row.body == final  # the raw body, as received
    listed = httpx.get(
        f"{server.url}/api/crcr/results", params={"repo": "acme/torch-widget"}
    ).json()
    assert [r["key"] for r in listed] == [key]
    assert listed[0]["workflow"]["test_results"]["failed"] == 1
    assert listed[0]["workflow"]["ci_metrics"] == {"queue_time": 12.5, "execution_time": 300.0}
    assert httpx.get(f"{server.url}/api/crcr/results", params={"repo": "other/repo"}).json() == []
    raw = httpx.get(f"{server.url}/api/crcr/results/{row.id}/body")
    assert raw.content == final


def test_another_check_run_id_is_another_record(server: Server) -> None:
    other = copy.deepcopy(BODY)
    other["untrusted"]["callback_payload"]["workflow"]["check_run_id"] = "4243"
    assert server.post(BODY).status_code == 201
    assert server.post(other).status_code == 201
    assert len(server.rows()) == 2


def test_a_late_in_progress_does_not_undo_completed(server: Server) -> None:
    assert server.post(completed()).status_code == 201
    late = server.post(BODY)
    assert late.status_code == 200 and late.json()["updated"] is False
    (row,) = server.rows()
    assert row.status == "completed"


@pytest.mark.parametrize(
    ("token", "reason"),
    [(None, "missing x-hud-internal-bot"), ("nope", "wrong x-hud-internal-bot")],
)
def test_the_bot_token_is_required(server: Server, token: str | None, reason: str) -> None:
    response = server.post(BODY, token=token)
    assert response.status_code == 401 and response.json()["error"] == reason
    assert server.rows() == []
    with server.rt.db.session() as s:
        audit = s.scalars(select(AuditRecord)).one()
    assert (audit.status, audit.path) == (401, "/api/crcr/results")


def test_ingest_is_closed_without_a_configured_token(database_url: str, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    rt = RelayContext(make_settings(database_url, tmp_path))
    rt.db.upgrade()
    with TestClient(create_app(rt, lambda steps: None)) as client:
        response = client.post("/api/crcr/results", json=BODY, headers={"x-hud-internal-bot": ""})
    rt.db.dispose()
    assert response.status_code == 401 and "CI_RELAY_HUD_TOKEN" in response.json()["error"]


def test_a_body_over_2_mib_is_refused_by_its_declared_length(server: Server) -> None:
    response = server.post(b"x" * (LIMIT + 1))
    assert response.status_code == 413 and str(LIMIT) in response.json()["error"]


def test_a_body_over_2_mib_is_refused_while_streaming(server: Server) -> None:
    """Chunked, no Content-Length: the limit is counted on what arrives."""
    sent = {"bytes": 0}

    def chunks() -> Iterator[bytes]:
        for _ in range(64):
            sent["bytes"] += 64 * 1024
            yield b" " * (64 * 1024)  # 4 MiB of JSON whitespace in all

    try:
        response = httpx.post(
            f"{server.url}/api/crcr/results",
            content=chunks(),
            headers={"x-hud-internal-bot": TOKEN, "content-type": "application/json"},
            timeout=60,
        )
    except httpx.HTTPError:  # the server may close before the client finished sending
        pass
    else:
        assert "content-length" not in response.request.headers
        assert response.status_code == 413, response.text
        assert str(LIMIT) in response.json()["error"]
    assert server.rows() == []
    with server.rt.db.session() as s:
        assert s.scalars(select(AuditRecord.status)).all() == [413]


def test_a_body_just_under_the_limit_is_read(server: Server) -> None:
    body = json.dumps(BODY).encode()
    padded = body + b" " * (LIMIT - len(body))
    assert server.post(padded).status_code == 201


def test_malformed_json_is_422(server: Server) -> None:
    response = server.post(b'{"trusted": ')
    assert response.status_code == 422 and response.json()["error"].startswith("body is not JSON")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (
            ("untrusted", "callback_payload", "workflow"),
            {"job_name": None},
            "untrusted.callback_payload.workflow.job_name",
        ),
        (
            ("untrusted", "callback_payload", "workflow"),
            {"status": "done"},
            "untrusted.callback_payload.workflow.status",
        ),
        (
            ("untrusted", "callback_payload", "workflow"),
            {"schema_version": "2"},
            "untrusted.callback_payload.workflow.schema_version",
        ),
        (("trusted",), {"verified_repo": "not a repo"}, "trusted.verified_repo"),
        (
            ("untrusted", "callback_payload"),
            {"delivery_id": ""},
            "untrusted.callback_payload.delivery_id",
        ),
        (
            ("untrusted", "callback_payload", "workflow"),
            {"check_run_id": "x" * 65},
            "untrusted.callback_payload.workflow.check_run_id",
        ),
    ],
)
def test_schema_errors_name_the_field(
    server: Server, path: tuple[str, ...], value: dict[str, Any], field: str
) -> None:
    body = copy.deepcopy(BODY)
    target = body
    for part in path:
        target = target[part]
    target.update(value)
    response = server.post(body)
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith(f"field {field}:")
    assert server.rows() == []


def test_a_missing_section_names_it(server: Server) -> None:
    response = server.post({"trusted": BODY["trusted"]})
    assert response.status_code == 422 and response.json()["error"].startswith("field untrusted:")


def test_report_caps_are_part_of_the_schema(server: Server) -> None:
    body = completed()
    wf = body["untrusted"]["callback_payload"]["workflow"]
    wf["failed_tests"] = [{"name": f"t{i}", "message": "m"} for i in range(1001)]
    response = server.post(body)
    assert response.status_code == 422
    assert response.json()["error"].startswith(
        "field untrusted.callback_payload.workflow.failed_tests:"
    )
    wf["failed_tests"] = [{"name": "t", "message": "é" * 600}]  # 1,200 bytes
    response = server.post(body)
    assert response.status_code == 422 and "1024 bytes" in response.json()["error"]


def test_concurrent_posts_of_one_key_make_one_record(server: Server) -> None:
    bodies = [BODY if i % 2 else completed() for i in range(20)]
    with ThreadPoolExecutor(10) as pool:
        statuses = list(pool.map(lambda b: server.post(b).status_code, bodies))
    assert set(statuses) <= {200, 201} and statuses.count(201) == 1
    (row,) = server.rows()
    assert row.status == "completed"


def test_migrations_match_the_models_and_go_down_and_up(database_url: str, tmp_path: Path) -> None:
    rt = RelayContext(make_settings(database_url, tmp_path))
    rt.db.upgrade()
    try:
        with rt.db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        mine = [
            d
            for d in diff
            if any(
                t in repr(d)
                for t in ("'outbox'", "'crcr_results'", "'test_results'", "ix_outbox", "ix_crcr")
            )
        ]
        assert mine == []
        config = alembic_config(rt.db.engine.url.render_as_string(hide_password=False))
        with rt.db.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0001")
        assert "crcr_results" not in inspect(rt.db.engine).get_table_names()
        assert "key" not in {c["name"] for c in inspect(rt.db.engine).get_columns("outbox")}
        assert "details" not in {
            c["name"] for c in inspect(rt.db.engine).get_columns("test_results")
        }
        rt.db.upgrade()
        assert "details" in {c["name"] for c in inspect(rt.db.engine).get_columns("test_results")}
        assert "crcr_results" in inspect(rt.db.engine).get_table_names()
        with rt.db.session() as s:
            assert s.scalar(select(func.count()).select_from(CrcrResult)) == 0
    finally:
        rt.db.dispose()


def _hud_minimal() -> dict[str, Any]:
    """A completed body as lean as HUD's own handler takes it: no ``total``, ``url``,
    ``run_id``, ``conclusion``, timestamps or ``ci_metrics``; a text check run id; fields
    this relay does not know."""
    body = completed()
    del body["trusted"]["ci_metrics"]
    body["trusted"]["relay_version"] = "9.9"  # unknown fields are ignored
    wf = body["untrusted"]["callback_payload"]["workflow"]
    for key in ("url", "run_id", "conclusion", "started_at", "completed_at"):
        wf.pop(key, None)
    del wf["test_results"]["total"]
    wf["check_run_id"] = "check-77"
    wf["runner"] = {"label": "linux.spyre.1"}
    return body


def test_ingest_accepts_what_hud_accepts(server: Server) -> None:
    response = server.post(_hud_minimal())
    assert response.status_code == 201, response.text
    assert response.json()["key"].endswith("/widget-ci/test (widget)/check-77")
    (row,) = server.rows()
    assert row.status == "completed" and row.conclusion is None
    assert row.summary["test_results"]["total"] == 13  # passed + failed + skipped, as HUD adds
    assert row.summary["run_id"] is None and row.summary["url"] is None
    assert json.loads(row.body)["trusted"]["relay_version"] == "9.9"  # kept as received
    listed = httpx.get(f"{server.url}/api/crcr/results", timeout=30).json()
    assert listed[0]["check_run_id"] == "check-77"


@pytest.mark.parametrize("missing", ["job_name", "check_run_id"])
def test_ingest_still_requires_what_hud_requires(server: Server, missing: str) -> None:
    body = _hud_minimal()
    del body["untrusted"]["callback_payload"]["workflow"][missing]
    response = server.post(body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == (
        f"field untrusted.callback_payload.workflow.{missing}: Field required"
    )
    assert server.rows() == []


def test_a_given_total_is_kept_and_a_string_run_id_is_an_id(server: Server) -> None:
    body = completed()
    wf = body["untrusted"]["callback_payload"]["workflow"]
    wf["run_id"] = "run-abc"
    wf["test_results"]["total"] = 20  # HUD keeps what the sender counted
    assert server.post(body).status_code == 201
    (row,) = server.rows()
    assert row.summary["run_id"] == "run-abc" and row.summary["test_results"]["total"] == 20
