"""Fixtures for relay tests: real databases (SQLite file, fresh PostgreSQL database) and apps."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, make_url, text

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.intake.signature import sign
from ci_relay.service.app import create_app
from ci_relay.settings import Settings
from ci_relay.steps import Next
from tests.gitrepo import GitRepo

POSTGRES_ADMIN_URL = os.environ.get(
    "CI_RELAY_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SECRET = "It's a Secret to Everybody"
DISPATCH_TOKEN = "dispatch-token-for-tests"
FIXTURES = Path(__file__).resolve().parent / "data" / "github"  # SOURCE.md there

POLICY = """
repositories:
  Codertocat/Hello-World:
    backends:
      cpu: {level: L2}
  github/hello-world:
    backends:
      cpu: {level: L2}
  sample/pytorch:
    backends:
      cpu: {level: L3}
  octo-org/octo-repo:
    backends:
      cpu: {level: L1}
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new, empty database on each backend the relay supports."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'relay.db'}"
        return
    with fresh_postgres_database() as url:
        yield url


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A new, empty schema of its own in the real PostgreSQL server's test database, dropped
    afterwards: the URL makes it every session's search_path, so the migrations put every
    table, type and alembic_version there. A schema costs a fraction of a database (no copy
    of template1 to write and sync), and the tests stay apart by name as before."""
    name = f"relay_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    try:
        # a test database need not outlive a power cut: commits do not wait for the disk
        # (the server's own setting is untouched; only these sessions change)
        options = f"-csynchronous_commit=off -csearch_path={name}"
        yield (
            make_url(POSTGRES_ADMIN_URL)
            .update_query_dict({"options": options})
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.connect() as conn:
            # a session the test left holding a lock must not hang the suite: give up instead
            conn.execute(text("SET lock_timeout = '30s'"))
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        admin.dispose()


@dataclass
class Relay:
    rt: RelayContext
    client: TestClient
    enqueued: list[Next] = field(default_factory=list)


def make_settings(database_url: str, tmp_path: Path, **extra: object) -> Settings:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Settings(
        database_url=database_url,
        data_dir=tmp_path / "data",
        webhook_secret=SECRET,  # type: ignore[arg-type]
        dispatch_token=DISPATCH_TOKEN,  # type: ignore[arg-type]
        policy_file=policy,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
def relay(database_url: str, tmp_path: Path) -> Iterator[Relay]:
    rt = RelayContext(make_settings(database_url, tmp_path, max_body_bytes=64 * 1024))
    rt.db.upgrade()
    enqueued: list[Next] = []
    app = create_app(rt, enqueued.extend)
    with TestClient(app) as client:
        yield Relay(rt, client, enqueued)
    rt.db.dispose()


def upstream_context(
    tmp_path: Path,
    upstream: Path,
    spec: str,
    backends: tuple[str, ...] = ("cpu",),
    labels: dict[str, str] | None = None,
    modes: dict[str, str] | None = None,
    **extra: object,
) -> RelayContext:
    """A relay on SQLite that tests ``upstream`` (L2 ``backends``, cpu by default, for
    sample/pytorch; ``labels``: the spec label the policy gives a backend, ``modes`` its
    selection mode) under ``spec``, every test the spec allows, no agent; its database is
    migrated."""
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(spec)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "repositories:\n  sample/pytorch:\n    backends:\n"
        + "".join(
            f"      {b}: {{level: L2{f', label: {labels[b]}' if b in (labels or {}) else ''}"
            f"{f', selection: {modes[b]}' if b in (modes or {}) else ''}}}\n"
            for b in backends
        )
    )
    rt = RelayContext(
        Settings(
            database_url=f"sqlite:///{tmp_path / 'relay.db'}",
            data_dir=tmp_path / "data",
            webhook_secret=SECRET,  # type: ignore[arg-type]
            policy_file=policy,
            upstream_repo=str(upstream),
            specs=[spec_file],
            selection_agent="none",
            selection_budget=extra.pop("selection_budget", "all"),  # type: ignore[arg-type]
            **extra,  # type: ignore[arg-type]
        )
    )
    rt.db.upgrade()
    return rt


@contextmanager
def served_app(rt: RelayContext) -> Iterator[str]:
    """The relay's app behind a real HTTP server on loopback (what a browser and the CLI
    talk to); its base URL."""
    import threading
    import time

    import uvicorn

    from ci_relay.demo import free_port

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(rt, lambda _steps: None), port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def pull_request(repo: GitRepo, number: int, action: str = "opened") -> dict[str, Any]:
    """A pull_request payload of sample/pytorch: HEAD of ``repo`` against its parent."""
    return {
        "action": action,
        "number": number,
        "pull_request": {
            "number": number,
            "head": {"sha": repo.git("rev-parse", "HEAD"), "ref": f"pr-{number}"},
            "base": {"sha": repo.git("rev-parse", "HEAD~1"), "ref": "main"},
            "labels": [],
        },
        "repository": {"full_name": "sample/pytorch"},
    }


def post_webhook(client: TestClient, event: str, payload: dict[str, Any]) -> None:
    """A webhook signed with ``SECRET``, which the relay must accept."""
    body = json.dumps(payload).encode()
    response = client.post(
        "/webhooks/github",
        content=body,
        headers={
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": sign(SECRET, body),
        },
    )
    assert response.status_code == 202, response.text


def drain(rt: RelayContext, steps: list[Next]) -> None:
    """Run every queued pipeline step in this process, as a worker would (reports are left
    in the outbox)."""
    while steps:
        step = steps.pop(0)
        if step.task != "report":  # the outbox's messages stay there (the sender's work)
            steps += pipeline.run_step(rt, step)
