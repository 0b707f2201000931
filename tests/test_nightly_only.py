"""Nightly-only backends (issue 56, item 2; CRCR's nightly-only L2, pytorch/pytorch #197864):
a backend the policy runs on nightly dispatches only is never queued for a pull request or a
push; the change records it as skipped with why, and /api/changes and the commit page say it.
The real app on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay.context import RelayContext
from ci_relay.policy import Level, PolicyError, load_policy
from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import Run
from tests.relay_fixtures import Relay, make_settings
from tests.test_intake import fixture_body, headers, process_all

HEAD = "ec26c3e57ca3a959ca5aad62de7213c562f8c821"  # the fixture pull request's head


def _relay(database_url: str, tmp_path: Path, backends: str) -> Iterator[Relay]:
    settings = make_settings(database_url, tmp_path)
    (tmp_path / "policy.yaml").write_text(
        f"repositories:\n  Codertocat/Hello-World:\n    backends:\n{backends}"
    )
    rt = RelayContext(settings)
    rt.db.upgrade()
    enqueued: list[Next] = []
    with TestClient(create_app(rt, enqueued.extend)) as client:
        yield Relay(rt, client, enqueued)
    rt.db.dispose()


@pytest.fixture
def mixed(database_url: str, tmp_path: Path) -> Iterator[Relay]:
    yield from _relay(
        database_url,
        tmp_path,
        "      cpu: {level: L2, nightly_only: true}\n      spyre-emu: {level: L2}\n",
    )


def _pull_request(relay: Relay) -> dict[str, object]:
    body = fixture_body("pull_request/synchronize.payload.json")
    done = relay.client.post(
        "/webhooks/github", content=body, headers=headers("pull_request", body, delivery="d-1")
    )
    assert done.status_code == 202, done.text
    process_all(relay)
    (change,) = relay.client.get("/api/changes").json()
    return dict(change)


def test_a_pull_request_runs_only_the_backends_that_are_not_nightly_only(mixed: Relay) -> None:
    change = _pull_request(mixed)
    assert [r["backend"] for r in change["runs"]] == ["spyre-emu"]
    reason = "nightly only under the policy: not run for a pull request"
    assert change["skipped"] == [{"backend": "cpu", "reason": reason}]
    with mixed.rt.db.session() as s:
        assert [r.backend for r in s.scalars(select(Run))] == ["spyre-emu"]  # never queued
    page = mixed.client.get(f"/commits/{HEAD}").text
    assert f"Not run on <strong>cpu</strong> for this pull request: {reason}." in page


def test_a_change_every_backend_skips_is_recorded_with_why(
    database_url: str, tmp_path: Path
) -> None:
    for relay in _relay(database_url, tmp_path, "      cpu: {level: L2, nightly_only: true}\n"):
        change = _pull_request(relay)
        assert change["runs"] == [] and change["state"] == "recorded"
        assert change["skipped"][0]["backend"] == "cpu"
        (delivery,) = relay.client.get("/api/deliveries").json()
        assert "cpu: nightly only under the policy" in delivery["reason"]


def test_the_nightly_runs_a_nightly_only_backend_and_bad_values_are_refused(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "repositories:\n  a/b:\n    backends:\n"
        "      cpu: {level: L2, nightly_only: true}\n      spyre-emu: {level: L3}\n"
    )
    loaded = load_policy(policy)
    repo = loaded.for_repository("a/b")
    assert repo is not None
    assert loaded.runs_for(repo, "nightly", []) == [("cpu", Level.L2), ("spyre-emu", Level.L3)]
    assert loaded.runs_for(repo, "push", []) == []
    assert loaded.skipped_for(repo, "nightly") == []
    assert loaded.skipped_for(repo, "push")[0]["reason"].endswith("not run for a push")
    policy.write_text("repositories:\n  a/b:\n    backends:\n      cpu: {nightly_only: maybe}\n")
    with pytest.raises(PolicyError, match="nightly_only"):
        load_policy(policy)
    policy.write_text("repositories:\n  a/b:\n    backends:\n      tpu: {nightly_only: true}\n")
    with pytest.raises(PolicyError, match="unknown backend"):
        load_policy(policy)
