"""Webhook and dispatch intake against real SQLite and PostgreSQL databases."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import func, select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.intake.signature import sign, verify
from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import AuditRecord, Change, Delivery, Run
from tests.relay_fixtures import DISPATCH_TOKEN, FIXTURES, SECRET, Relay, make_settings


def headers(event: str, body: bytes, delivery: str | None = None, **extra: str) -> dict[str, str]:
    h = {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-GitHub-Hook-ID": "4242",
        "X-Hub-Signature-256": sign(SECRET, body),
        "Content-Type": "application/json",
    }
    h.update(extra)
    return h


def fixture_body(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def counts(relay: Relay) -> dict[str, int]:
    with relay.rt.db.session() as s:
        return {
            model.__tablename__: s.scalar(select(func.count()).select_from(model)) or 0
            for model in (Delivery, Change, Run, AuditRecord)
        }


def process_all(relay: Relay) -> None:
    """Run the queued intake steps synchronously (the worker's job, minus the queue)."""
    while relay.enqueued:
        step = relay.enqueued.pop(0)
        if step.task == "process":
            relay.enqueued.extend(pipeline.process_delivery(relay.rt, step.arg))


def test_official_signature_vector() -> None:
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert sign("It's a Secret to Everybody", b"Hello, World!") == expected
    assert verify("It's a Secret to Everybody", b"Hello, World!", expected)
    assert not verify("It's a Secret to Everybody", b"Hello, World?", expected)
    assert not verify("It's a Secret to Everybody", b"Hello, World!", None)
    assert not verify(
        "It's a Secret to Everybody", b"Hello, World!", expected.replace("sha256=", "sha1=")
    )


EXPECTED: dict[str, tuple[int, str, int]] = {
    # fixture: (HTTP status, final delivery state, runs created)
    "ping/payload.json": (200, "ignored", 0),
    "pull_request/opened.payload.json": (202, "processed", 1),
    "pull_request/closed.payload.json": (202, "processed", 0),
    "pull_request/labeled.payload.json": (202, "processed", 1),
    "pull_request/synchronize.payload.json": (202, "processed", 1),
    "push/payload.json": (202, "ignored", 0),
    "push/with-new-branch.payload.json": (202, "processed", 1),
    "check_run/rerequested.payload.json": (202, "processed", 1),
    "repository_dispatch/payload.json": (202, "ignored", 0),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_github_payloads_are_accepted_or_ignored(relay: Relay, name: str) -> None:
    status, final_state, runs = EXPECTED[name]
    body = fixture_body(name)
    event = name.split("/")[0]
    response = relay.client.post("/webhooks/github", content=body, headers=headers(event, body))
    assert response.status_code == status, response.text
    process_all(relay)
    with relay.rt.db.session() as s:
        delivery = s.scalars(select(Delivery)).one()
        assert delivery.state == final_state, delivery.reason
        assert delivery.body == body  # the raw bytes, as received
        assert delivery.event == event
        run_count = s.scalar(select(func.count()).select_from(Run))
    assert run_count == runs
    if runs:
        assert [n.task for n in relay.enqueued] == [] and counts(relay)["changes"] == 1


def test_same_head_runs_once_until_a_rerun_is_requested(relay: Relay) -> None:
    for name in ("pull_request/opened.payload.json", "pull_request/synchronize.payload.json"):
        body = fixture_body(name)
        relay.client.post("/webhooks/github", content=body, headers=headers("pull_request", body))
    payload = json.loads(fixture_body("check_run/rerequested.payload.json"))
    payload["repository"]["full_name"] = "Codertocat/Hello-World"
    payload["check_run"]["head_sha"] = "ec26c3e57ca3a959ca5aad62de7213c562f8c821"
    body = json.dumps(payload).encode()
    relay.client.post("/webhooks/github", content=body, headers=headers("check_run", body))
    process_all(relay)
    with relay.rt.db.session() as s:
        runs = s.scalars(select(Run).order_by(Run.id)).all()
        assert [(r.backend, r.attempt) for r in runs] == [("cpu", 1), ("cpu", 2)]
        rerun_change = s.get(Change, runs[1].change_id)
        assert (
            rerun_change is not None and rerun_change.kind == "rerun" and rerun_change.number == 2
        )


def _rejects(relay: Relay, response: httpx.Response, status: int, reason: str) -> None:
    assert response.status_code == status, response.text
    assert reason in response.json()["error"]
    assert counts(relay) == {"deliveries": 0, "changes": 0, "runs": 0, "audit_records": 1}
    with relay.rt.db.session() as s:
        record = s.scalars(select(AuditRecord)).one()
        assert record.status == status and reason in record.reason


BODY = fixture_body("pull_request/opened.payload.json")


def test_missing_signature(relay: Relay) -> None:
    h = headers("pull_request", BODY)
    del h["X-Hub-Signature-256"]
    _rejects(
        relay,
        relay.client.post("/webhooks/github", content=BODY, headers=h),
        401,
        "missing X-Hub-Signature-256",
    )


def test_wrong_signature(relay: Relay) -> None:
    h = headers("pull_request", BODY, **{"X-Hub-Signature-256": sign("not the secret", BODY)})
    _rejects(
        relay,
        relay.client.post("/webhooks/github", content=BODY, headers=h),
        401,
        "signature mismatch",
    )


def test_signature_over_other_bytes(relay: Relay) -> None:
    h = headers("pull_request", BODY)
    tampered = BODY.replace(b'"opened"', b'"closed"')
    _rejects(
        relay,
        relay.client.post("/webhooks/github", content=tampered, headers=h),
        401,
        "signature mismatch",
    )


@pytest.mark.parametrize("missing", ["X-GitHub-Event", "X-GitHub-Delivery"])
def test_missing_headers(relay: Relay, missing: str) -> None:
    h = headers("pull_request", BODY)
    del h[missing]
    _rejects(
        relay,
        relay.client.post("/webhooks/github", content=BODY, headers=h),
        400,
        f"missing header {missing}",
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "body is not JSON"),
        (b"\xff\xfe", "body is not JSON"),
        (b"[1, 2]", "not a JSON object"),
    ],
)
def test_non_json(relay: Relay, body: bytes, reason: str) -> None:
    response = relay.client.post("/webhooks/github", content=body, headers=headers("push", body))
    _rejects(relay, response, 400, reason)


def test_oversized_body_declared(relay: Relay) -> None:
    big = b"x" * (64 * 1024 + 1)
    response = relay.client.post("/webhooks/github", content=big, headers=headers("push", big))
    _rejects(relay, response, 413, "body over 65536 bytes")


def test_oversized_body_streamed_without_length(relay: Relay) -> None:
    def chunks() -> Any:
        for _ in range(200):  # 200 x 8 KiB, far past the 64 KiB limit, no Content-Length
            yield b"y" * 8192

    h = headers("push", b"")
    response = relay.client.post("/webhooks/github", content=chunks(), headers=h)
    _rejects(relay, response, 413, "body over")


def test_repository_not_in_allowlist(relay: Relay) -> None:
    payload = json.loads(BODY)
    payload["repository"]["full_name"] = "someone/else"
    body = json.dumps(payload).encode()
    response = relay.client.post(
        "/webhooks/github", content=body, headers=headers("pull_request", body)
    )
    assert response.status_code == 202 and response.json()["state"] == "ignored"
    assert "not in the allowlist" in response.json()["reason"]
    assert counts(relay) == {"deliveries": 0, "changes": 0, "runs": 0, "audit_records": 1}


def test_dispatch_envelope(relay: Relay) -> None:
    envelope = {"event_type": "pull_request", "delivery_id": "crcr-1", "payload": json.loads(BODY)}
    auth = {"Authorization": f"Bearer {DISPATCH_TOKEN}"}
    response = relay.client.post("/webhooks/dispatch", json=envelope, headers=auth)
    assert response.status_code == 202, response.text
    # the same envelope inside a repository_dispatch body is the same delivery
    wrapped = {"action": "crcr", "client_payload": envelope}
    again = relay.client.post("/webhooks/dispatch", json=wrapped, headers=auth)
    assert again.status_code == 202 and again.json()["duplicate"] is True
    process_all(relay)
    assert counts(relay) == {"deliveries": 1, "changes": 1, "runs": 1, "audit_records": 0}


@pytest.mark.parametrize(
    ("envelope", "field"),
    [
        ({"delivery_id": "d", "payload": {}}, "event_type"),
        ({"event_type": "push", "delivery_id": "d", "payload": "nope"}, "payload"),
        ({"event_type": "push", "payload": {}}, "delivery_id"),
    ],
)
def test_malformed_dispatch_names_the_field(
    relay: Relay, envelope: dict[str, Any], field: str
) -> None:
    response = relay.client.post(
        "/webhooks/dispatch", json=envelope, headers={"Authorization": f"Bearer {DISPATCH_TOKEN}"}
    )
    _rejects(relay, response, 422, f"envelope field {field}")


def test_dispatch_needs_the_token(relay: Relay) -> None:
    envelope = {"event_type": "push", "delivery_id": "d", "payload": {}}
    response = relay.client.post(
        "/webhooks/dispatch", json=envelope, headers={"Authorization": "Bearer wrong"}
    )
    _rejects(relay, response, 401, "bad bearer token")


def test_api_lists_deliveries_and_changes(relay: Relay) -> None:
    body = fixture_body("pull_request/synchronize.payload.json")
    relay.client.post(
        "/webhooks/github", content=body, headers=headers("pull_request", body, delivery="d-1")
    )
    process_all(relay)
    (delivery,) = relay.client.get("/api/deliveries").json()
    assert {
        k: delivery[k]
        for k in ("delivery_id", "event", "action", "repository", "head_sha", "state")
    } == {
        "delivery_id": "d-1",
        "event": "pull_request",
        "action": "synchronize",
        "repository": "Codertocat/Hello-World",
        "head_sha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
        "state": "processed",
    }
    (change,) = relay.client.get("/api/changes").json()
    assert change["delivery_id"] == "d-1" and change["action"] == "synchronize"
    assert change["head_sha"] == delivery["head_sha"] and change["state"] == "running"
    assert change["runs"][0]["state"] == "pending"
    assert relay.client.get(f"/api/runs/{change['runs'][0]['id']}").json()["backend"] == "cpu"
    assert relay.client.get("/api/runs/999").status_code == 404


def test_health_readiness_and_metrics(relay: Relay) -> None:
    assert relay.client.get("/healthz").json() == {"status": "ok"}
    ready = relay.client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"database": "ok", "broker": "ok"}
    relay.client.post("/webhooks/github", content=BODY, headers=headers("pull_request", BODY))
    relay.client.post("/webhooks/github", content=b"{}", headers={"X-GitHub-Event": "push"})
    text = relay.client.get("/metrics").text
    assert 'ci_relay_deliveries_total{event="pull_request",outcome="received"} 1.0' in text
    assert 'ci_relay_deliveries_total{event="push",outcome="rejected_401"} 1.0' in text
    assert "ci_relay_ack_seconds_bucket" in text
    assert 'ci_relay_pending{kind="deliveries"} 1.0' in text


def test_readiness_reports_an_unreachable_broker(relay: Relay) -> None:
    app = create_app(relay.rt, relay.enqueued.extend, broker_ok=lambda: False)
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["broker"] == "unreachable"


def test_same_delivery_100_times_concurrently(database_url: str, tmp_path: Path) -> None:
    """Real HTTP on loopback: 100 concurrent copies of one delivery give one row, one change, one run."""
    rt = RelayContext(make_settings(database_url, tmp_path))
    rt.db.upgrade()
    enqueued: list[Next] = []
    lock = threading.Lock()

    def record(steps: list[Next]) -> None:
        with lock:
            enqueued.extend(steps)

    config = uvicorn.Config(create_app(rt, record), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    h = headers("pull_request", BODY, delivery="same-delivery")
    try:
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client,
            ThreadPoolExecutor(20) as pool,
        ):
            statuses = list(
                pool.map(
                    lambda _: client.post("/webhooks/github", content=BODY, headers=h).status_code,
                    range(100),
                )
            )
        assert statuses == [202] * 100
        # every enqueued copy is processed, concurrently too
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda step: pipeline.process_delivery(rt, step.arg), list(enqueued)))
        with rt.db.session() as s:
            assert s.scalar(select(func.count()).select_from(Delivery)) == 1
            assert s.scalar(select(func.count()).select_from(Change)) == 1
            assert s.scalar(select(func.count()).select_from(Run)) == 1
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        rt.db.dispose()


def test_the_api_lets_requests_in_between_the_publishers_work(tmp_path: Path) -> None:
    """The app shortens the GIL switch interval while it serves (the publisher thread's
    Celery sends otherwise make waiting webhook requests the p99 tail: bench/README), and
    gives the process its own interval back when it stops."""
    import sys

    from fastapi.testclient import TestClient

    from ci_relay.context import RelayContext
    from ci_relay.service.app import GIL_SWITCH_SECONDS, create_app
    from tests.relay_fixtures import make_settings

    before = sys.getswitchinterval()
    rt = RelayContext(make_settings(f"sqlite:///{tmp_path / 'relay.db'}", tmp_path))
    rt.db.upgrade()
    with TestClient(create_app(rt, lambda _steps: None)):
        assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_SECONDS)
    assert sys.getswitchinterval() == pytest.approx(before)
    rt.db.dispose()
