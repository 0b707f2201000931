"""Hostile values in signed webhooks and dispatch envelopes: refused at the edge, by field.

Every case is a request an attacker can make (anyone can open a pull request, so anyone
writes ``head.ref`` and labels; a leaked token or a compromised relay writes the rest).
Each must get a clear 4xx naming the field, store nothing but one audit row, and never
reach git, a path or the queue. Run on SQLite and on PostgreSQL (whose fixed-width columns
and strict text encoding turn a missed check into a 500).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import func, select

from ci_relay.checkouts import CheckoutError, UpstreamMirror
from ci_relay.context import RelayContext
from ci_relay.service.app import create_app
from ci_relay.store.models import AuditRecord, Change, Delivery, Run
from tests.relay_fixtures import DISPATCH_TOKEN, FIXTURES, Relay, make_settings
from tests.test_intake import counts, headers, process_all

# what was reproduced against a running relay: git ran the command on the worker
UPLOAD_PACK = "--upload-pack=touch /tmp/ci-relay-pwned; git-upload-pack"
PR = json.loads((FIXTURES / "pull_request/opened.payload.json").read_bytes())
PUSH = json.loads((FIXTURES / "push/with-new-branch.payload.json").read_bytes())
CHECK = json.loads((FIXTURES / "check_run/rerequested.payload.json").read_bytes())
NOTHING_STORED = {"deliveries": 0, "changes": 0, "runs": 0, "audit_records": 1}


def edited(payload: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(payload)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return out


DELETE = object()
HOSTILE: list[tuple[str, dict[str, Any], str, str]] = [
    # (event, payload, field named in the answer, what the answer says)
    (
        "pull_request",
        edited(PR, "pull_request.head.sha", UPLOAD_PACK),
        "pull_request.head.sha",
        "not a commit id",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.base.sha", "-" * 40),
        "pull_request.base.sha",
        "not a commit id",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.head.sha", "A" * 40),
        "pull_request.head.sha",
        "not a commit id",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.head.sha", "ec26c3e5"),
        "pull_request.head.sha",
        "not a commit id",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.head.sha", DELETE),
        "pull_request.head.sha",
        "missing",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.head.sha", 12),
        "pull_request.head.sha",
        "valid string",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.head.ref", "--output=/etc/passwd"),
        "pull_request.head.ref",
        "not a git ref",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.head.ref", "a..b"),
        "pull_request.head.ref",
        "not a git ref",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.head.ref", "x\ny"),
        "pull_request.head.ref",
        "not a git ref",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.number", "1; rm -rf /"),
        "pull_request.number",
        "integer",
    ),
    ("pull_request", edited(PR, "pull_request.number", True), "pull_request.number", "integer"),
    (
        "pull_request",
        edited(PR, "pull_request.number", 2**40),
        "pull_request.number",
        "less than or equal",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.number", 0),
        "pull_request.number",
        "greater than or equal",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.labels", [{"name": "x\x00y"}]),
        "pull_request.labels.0.name",
        "not a label",
    ),
    (
        "pull_request",
        edited(PR, "pull_request.labels", [{"name": "l"}] * 101),
        "pull_request.labels",
        "at most 100",
    ),
    (
        "pull_request",
        edited(PR, "repository.full_name", "../../etc/passwd"),
        "repository.full_name",
        "not a repository name",
    ),
    (
        "pull_request",
        edited(PR, "repository.full_name", "a/" + "b" * 10_000),
        "repository.full_name",
        "not a repository name",
    ),
    (
        "pull_request",
        edited(PR, "repository.full_name", "owner/.."),
        "repository.full_name",
        "not a repository name",
    ),
    ("pull_request", edited(PR, "action", "x" * 500), "action", "not an event name"),
    ("push", edited(PUSH, "after", UPLOAD_PACK), "after", "not a commit id"),
    ("push", edited(PUSH, "before", "HEAD~1"), "before", "not a commit id"),
    ("push", edited(PUSH, "ref", "refs/heads/-x/../y"), "ref", "not a git ref"),
    ("push", edited(PUSH, "deleted", "yes"), "deleted", "boolean"),
    (
        "check_run",
        edited(CHECK, "check_run.head_sha", UPLOAD_PACK),
        "check_run.head_sha",
        "not a commit id",
    ),
    # an event the relay does not handle still has its repository and action stored
    (
        "issues",
        {"action": "opened", "repository": {"full_name": "x" * 300}},
        "repository.full_name",
        "not a repository name",
    ),
]


@pytest.mark.parametrize(
    ("event", "payload", "field", "says"),
    HOSTILE,
    ids=[f"{e}-{f}-{i}" for i, (e, _, f, _) in enumerate(HOSTILE)],
)
def test_hostile_webhook_fields_are_refused_by_name(
    relay: Relay, event: str, payload: dict[str, Any], field: str, says: str
) -> None:
    body = json.dumps(payload).encode()
    response = relay.client.post("/webhooks/github", content=body, headers=headers(event, body))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error.startswith(f"{field}: ") and says in error, error
    assert counts(relay) == NOTHING_STORED
    assert relay.enqueued == []
    with relay.rt.db.session() as s:
        record = s.scalars(select(AuditRecord)).one()
        assert record.status == 422 and record.reason.startswith(field)


@pytest.mark.parametrize(
    ("header", "value", "says"),
    [
        ("X-GitHub-Delivery", "a b", "not a delivery id"),
        ("X-GitHub-Delivery", "../../x", "not a delivery id"),
        ("X-GitHub-Delivery", "d" * 129, "not a delivery id"),
        ("X-GitHub-Event", "Pull_Request", "not an event name"),
        ("X-GitHub-Event", "e" * 65, "not an event name"),
        ("X-GitHub-Hook-ID", "12; drop table", "not a hook id"),
        ("X-GitHub-Hook-ID", "9" * 21, "not a hook id"),
    ],
)
def test_hostile_headers_are_refused(relay: Relay, header: str, value: str, says: str) -> None:
    body = json.dumps(PR).encode()
    response = relay.client.post(
        "/webhooks/github", content=body, headers=headers("pull_request", body, **{header: value})
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(f"header {header}: {says}")
    assert counts(relay) == NOTHING_STORED


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"n": ' + b"9" * 5000 + b"}", "body is not JSON"),  # past Python's int limit
        (b"[" * 20_000 + b"]" * 20_000, "body is not JSON"),  # deeper than the parser goes
        (b'{"action": "opened", "x": "\\ud800"}', "lone UTF-16 surrogate"),
        (b'{"a": 1}\xff', "body is not JSON"),
    ],
    ids=["giant-int", "deep-nesting", "lone-surrogate", "invalid-utf8"],
)
def test_bodies_json_cannot_express_safely_are_refused(
    relay: Relay, body: bytes, says: str
) -> None:
    response = relay.client.post("/webhooks/github", content=body, headers=headers("push", body))
    assert response.status_code == 400 and says in response.json()["error"], response.text
    assert counts(relay) == NOTHING_STORED


def test_non_ascii_signature_is_a_mismatch_not_a_crash(relay: Relay) -> None:
    body = json.dumps(PR).encode()
    h = headers("pull_request", body)
    h["X-Hub-Signature-256"] = "sha256=\u00e9" + "0" * 63
    response = relay.client.post(
        "/webhooks/github",
        content=body,
        headers={k: v.encode("latin-1") for k, v in h.items()},  # type: ignore[misc]
    )
    assert response.status_code == 401 and "signature mismatch" in response.text
    assert counts(relay) == NOTHING_STORED


@pytest.mark.parametrize(
    ("envelope", "field"),
    [
        (
            {
                "event_type": "pull_request",
                "delivery_id": "d-1",
                "payload": edited(PR, "pull_request.head.sha", UPLOAD_PACK),
            },
            "envelope field payload.pull_request.head.sha: not a commit id",
        ),
        (
            {"event_type": "push", "delivery_id": "d-2", "payload": edited(PUSH, "after", "$(id)")},
            "envelope field payload.after: not a commit id",
        ),
        (
            {"event_type": "Push; id", "delivery_id": "d-3", "payload": PUSH},
            "envelope field event_type: not an event name",
        ),
        (
            {"event_type": "push", "delivery_id": "../../etc", "payload": PUSH},
            "envelope field delivery_id: not a delivery id",
        ),
        (
            {"event_type": "push", "delivery_id": "d-4", "payload": {"after": "f" * 40}},
            "envelope field payload.ref: missing",
        ),
    ],
)
def test_hostile_dispatch_envelopes_are_refused_by_name(
    relay: Relay, envelope: dict[str, Any], field: str
) -> None:
    response = relay.client.post(
        "/webhooks/dispatch", json=envelope, headers={"Authorization": f"Bearer {DISPATCH_TOKEN}"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith(field), response.json()
    assert counts(relay) == NOTHING_STORED


@pytest.mark.parametrize("action", [["opened"], "x" * 65, "tab\there", 7])
def test_an_unhandled_events_odd_action_is_kept_out_not_refused(relay: Relay, action: Any) -> None:
    payload = {"action": action, "repository": {"full_name": "Codertocat/Hello-World"}}
    body = json.dumps(payload).encode()
    response = relay.client.post("/webhooks/github", content=body, headers=headers("issues", body))
    assert response.status_code == 202, response.text
    with relay.rt.db.session() as s:
        row = s.scalars(select(Delivery)).one()
        assert row.action is None and row.state == "ignored" and row.body == body


def test_a_sha256_repository_commit_id_is_accepted(relay: Relay) -> None:
    payload = edited(PR, "pull_request.head.sha", "ab" * 32)
    payload = edited(payload, "pull_request.base.sha", "cd" * 32)
    body = json.dumps(payload).encode()
    response = relay.client.post(
        "/webhooks/github", content=body, headers=headers("pull_request", body)
    )
    assert response.status_code == 202, response.text
    process_all(relay)
    with relay.rt.db.session() as s:
        change = s.scalars(select(Change)).one()
        assert change.head_sha == "ab" * 32 and change.base_sha == "cd" * 32


def test_a_stored_delivery_that_fails_validation_is_refused_by_the_pipeline(
    relay: Relay,
) -> None:
    """A row stored before this validation existed (or replayed) never reaches git."""
    from ci_relay import pipeline
    from ci_relay.store.models import DeliveryState

    body = json.dumps(edited(PR, "pull_request.head.sha", UPLOAD_PACK)).encode()
    with relay.rt.db.session() as s:
        row = Delivery(
            source="github",
            hook_id="1",
            delivery_id="old-row",
            event="pull_request",
            state=DeliveryState.RECEIVED,
            headers={},
            body=body,
        )
        s.add(row)
        s.flush()
        pk = row.id
    assert pipeline.process_delivery(relay.rt, pk) == []
    with relay.rt.db.session() as s:
        row = s.get(Delivery, pk)
        assert row is not None and row.state == "ignored"
        assert row.reason is not None and "refused: pull_request.head.sha" in row.reason
        assert s.scalar(select(func.count()).select_from(Run)) == 0


@pytest.mark.parametrize("bad", [UPLOAD_PACK, "HEAD", "-" * 40, "e" * 39, "main^"])
def test_checkouts_refuse_anything_but_a_commit_id(tmp_path: Path, bad: str) -> None:
    """Defence in depth: git never sees a value that did not pass intake's check."""
    marker = tmp_path / "pwned"
    mirror = UpstreamMirror(tmp_path / "no-such-upstream", tmp_path / "mirrors")
    for attempt in (
        lambda: mirror.ensure(bad),
        lambda: mirror.rev_parse(bad),
        lambda: mirror.tree(bad).__enter__(),
    ):
        with pytest.raises(CheckoutError, match="refusing"):
            attempt()
    assert not (tmp_path / "mirrors").exists() and not marker.exists()


def test_a_flood_of_bad_signatures_costs_one_audit_row(database_url: str, tmp_path: Path) -> None:
    rt = RelayContext(make_settings(database_url, tmp_path, audit_window_seconds=3600))
    rt.db.upgrade()
    body = json.dumps(PR).encode()
    bad = headers("pull_request", body, **{"X-Hub-Signature-256": "sha256=" + "0" * 64})
    with TestClient(create_app(rt, lambda steps: None)) as client:
        for _ in range(300):
            assert client.post("/webhooks/github", content=body, headers=bad).status_code == 401
        unsigned = {k: v for k, v in bad.items() if k != "X-Hub-Signature-256"}
        for _ in range(50):  # another kind of rejection: a row of its own
            assert (
                client.post("/webhooks/github", content=body, headers=unsigned).status_code == 401
            )
        with rt.db.session() as s:
            assert s.scalar(select(func.count()).select_from(AuditRecord)) == 2
    # the app stopped: the counts kept in memory were written to their rows
    with rt.db.session() as s:
        rows = {r.reason: r.count for r in s.scalars(select(AuditRecord))}
        assert rows == {"signature mismatch": 300, "missing X-Hub-Signature-256": 50}
        assert s.scalar(select(func.count()).select_from(Delivery)) == 0
    rt.db.dispose()


def test_a_new_window_starts_a_new_audit_row(tmp_path: Path) -> None:
    from ci_relay.audit import AuditLog

    rt = RelayContext(make_settings(f"sqlite:///{tmp_path / 'r.db'}", tmp_path))
    rt.db.upgrade()
    clock = [1000.0]
    audit = AuditLog(rt.db, window_seconds=60, clock=lambda: clock[0])
    for _ in range(5):
        audit.record("/webhooks/github", 401, "signature mismatch", "10.0.0.1")
    clock[0] += 61
    audit.record("/webhooks/github", 401, "signature mismatch", "10.0.0.1")
    audit.record("/webhooks/github", 401, "signature mismatch", "10.0.0.2")  # another sender
    audit.flush()
    with rt.db.session() as s:
        rows = [
            (r.remote, r.count) for r in s.scalars(select(AuditRecord).order_by(AuditRecord.id))
        ]
    assert rows == [("10.0.0.1", 5), ("10.0.0.1", 1), ("10.0.0.2", 1)]
    rt.db.dispose()


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        (
            "repositories:\n  pytorch/pytorch:\n    backends:\n      'cpu;id': {level: L2}\n",
            "unknown backend(s) 'cpu;id'",
        ),
        (
            "repositories:\n  pytorch/pytorch:\n    backends:\n      tpu: {level: L2}\n",
            "unknown backend(s) 'tpu'",
        ),
        (
            "repositories:\n  ../pytorch:\n    backends:\n      cpu: {level: L2}\n",
            "not a repository name",
        ),
        (
            "repositories:\n  pytorch/pytorch:\n    backends:\n      cpu: {level: L3, device: 'x/../y'}\n",
            "should match pattern",
        ),
        ("repositories:\n  pytorch/pytorch:\n    backends:\n      cpu: {level: L9}\n", "L1"),
    ],
)
def test_a_policy_naming_what_cannot_be_a_queue_or_label_is_refused(
    tmp_path: Path, policy: str, says: str
) -> None:
    """Backends become queue names (exec.<backend>) and labels (ciflow/crcr/<device>)."""
    from ci_relay.policy import PolicyError, load_policy

    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    with pytest.raises(PolicyError, match=re.escape(says)):
        load_policy(path)


def test_hud_ingest_refuses_text_the_database_cannot_store(relay: Relay) -> None:
    """Found by Schemathesis: a NUL in a job name became a PostgreSQL error (500)."""
    from tests.fuzzing import HUD_TOKEN, VALID_HUD_BODY

    relay.rt.settings.hud_token = SecretStr(HUD_TOKEN)
    body = copy.deepcopy(VALID_HUD_BODY)
    body["untrusted"]["callback_payload"]["workflow"]["job_name"] = "test\u0000"
    response = relay.client.post(
        "/api/crcr/results",
        content=json.dumps(body).encode(),
        headers={"x-hud-internal-bot": HUD_TOKEN},
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith(
        "field untrusted.callback_payload.workflow.job_name: String should match pattern"
    )
    assert counts(relay)["audit_records"] == 1
