"""GitHub check runs (App) and commit statuses (token) against a loopback fake of GitHub's API.

The fake verifies the App's RS256 JWTs with the public half of a key made here, issues
expiring installation tokens, and enforces GitHub's limits (65,535 characters, 50
annotations per request, 1,000 statuses per sha and context) and rate-limit answers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.reporting import sender
from ci_relay.reporting.caps import triage_verdict
from ci_relay.reporting.github import AppAuth
from ci_relay.reporting.outbox import enqueue_reports
from ci_relay.store.models import OutboxMessage, Run, Triage, TriageState
from tests.relay_fixtures import make_settings
from tests.reporting_fakes import FakeGitHub, rsa_key_pair, seed_run

APP_ID = "123456"
PRIVATE_PEM, PUBLIC_PEM = rsa_key_pair()
SHORT = "AssertionError: Tensor-likes are not close!"


@pytest.fixture(autouse=True)
def fresh_token_cache() -> Iterator[None]:
    """Each test starts like a new process: no cached installation token."""
    AppAuth.forget()
    yield
    AppAuth.forget()


@pytest.fixture
def github() -> Iterator[tuple[FakeGitHub, str]]:
    fake = FakeGitHub(APP_ID, PUBLIC_PEM)
    with fake.running() as url:
        yield fake, url


@pytest.fixture
def make_rt(database_url: str, tmp_path: Path) -> Iterator[Any]:
    made: list[RelayContext] = []

    def make(api_url: str, **extra: Any) -> RelayContext:
        settings: dict[str, Any] = {
            "github_api_url": api_url,
            "public_url": "https://relay.example",
            "report_retry_base_seconds": 10,
        }
        if "github_token" not in extra:
            settings.update(github_app_id=APP_ID, github_app_private_key=PRIVATE_PEM)
        settings.update(extra)
        rt = RelayContext(make_settings(database_url, tmp_path, **settings))
        rt.db.upgrade()
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.db.dispose()


def start(rt: RelayContext, run_id: int) -> list[int]:
    with rt.db.session() as s:
        run = s.get(Run, run_id)
        assert run is not None
        return enqueue_reports(s, rt, run, "in_progress")


def finish(rt: RelayContext, run_id: int) -> list[int]:
    return [n.arg for n in pipeline.collect(rt, run_id) if n.task == "report"]


def row(rt: RelayContext, message_id: int) -> OutboxMessage:
    with rt.db.session() as s:
        found = s.get(OutboxMessage, message_id)
        assert found is not None
        return found


def aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def test_l4_check_run_in_progress_then_completed_with_annotations_in_batches(
    make_rt: Any, github: tuple[FakeGitHub, str]
) -> None:
    fake, url = github
    rt = make_rt(url, github_installation_id=77)
    run_id = seed_run(rt, level="L4", failures=120, passed=30, message=SHORT)
    (started,) = start(rt, run_id)
    assert sender.deliver(rt, started).state == "sent"
    (check,) = fake.check_runs.values()
    assert (check.status, check.repo, check.name) == (
        "in_progress",
        "sample/pytorch",
        "ci-relay / test (cpu)",
    )
    (completed,) = finish(rt, run_id)
    attempt = sender.deliver(rt, completed)
    assert attempt.state == "sent", attempt.error
    assert list(fake.check_runs) == [check.id]  # the same check run, completed
    assert (check.status, check.conclusion) == ("completed", "failure")
    assert len(check.annotations) == 120
    assert {a["annotation_level"] for a in check.annotations} == {"failure"}
    assert check.annotations[0]["path"] == "test/test_ops.py"
    assert check.output["title"] == "120 failed, 30 passed, 0 skipped (of 150)"
    patches = [s for s in fake.seen if s.method == "PATCH"]
    assert [len(p.json()["output"]["annotations"]) for p in patches] == [50, 50, 20]
    assert fake.token_requests() == 1  # the installation token is cached between reports
    claims = fake.jwt_claims[0]
    assert claims["exp"] - claims["iat"] <= 600 and claims["iss"] == APP_ID
    assert row(rt, completed).result == {
        "annotations_sent": 120,
        "main_done": True,
        "annotations_done": True,
        "check_run_id": check.id,
        "html_url": f"https://github.test/sample/pytorch/runs/{check.id}",
    }
    # triage's verdict follows as an update of the same check run, annotations not repeated
    with rt.db.session() as s:
        job = s.scalars(select(Triage).where(Triage.run_id == run_id)).one()  # collect queued it
        job.state = TriageState.DONE
        job.verdict = triage_verdict(
            "backend",
            "high",
            "test_ops fails at the base too.",
            ["backend (high): test_ops"],
            {"name": "ci-relay-triage", "version": "0.1.0"},
        ).model_dump(mode="json")
        run = s.get(Run, run_id)
        assert run is not None
        (update,) = enqueue_reports(s, rt, run, "completed")
    assert sender.deliver(rt, update).state == "sent"
    assert list(fake.check_runs) == [check.id] and len(check.annotations) == 120
    assert "### Triage: backend (high confidence)" in check.output["summary"]


def test_l3_labelled_pr_gets_a_neutral_check_on_failure(
    make_rt: Any, github: tuple[FakeGitHub, str]
) -> None:
    fake, url = github
    rt = make_rt(url)  # installation id looked up through the App
    run_id = seed_run(rt, level="L3", labels=("ciflow/crcr/cpu",), failures=2)
    (completed,) = finish(rt, run_id)
    assert sender.deliver(rt, completed).state == "sent"
    (check,) = fake.check_runs.values()
    assert (check.status, check.conclusion) == ("completed", "neutral")
    assert {a["annotation_level"] for a in check.annotations} == {"warning"}
    assert any(s.path == "/repos/sample/pytorch/installation" for s in fake.seen)


@pytest.mark.parametrize(
    ("level", "labels", "number"),
    [
        ("L3", (), 7),  # not labelled
        ("L3", ("ciflow/crcr/spyre",), 7),  # labelled for another device
        ("L2", ("ciflow/crcr/cpu",), 7),  # HUD only
        ("L4", (), None),  # a push: checks go on pull requests
    ],
)
def test_levels_without_a_github_report(
    make_rt: Any,
    github: tuple[FakeGitHub, str],
    level: str,
    labels: tuple[str, ...],
    number: int | None,
) -> None:
    fake, url = github
    rt = make_rt(url)
    assert finish(rt, seed_run(rt, level=level, labels=labels, number=number)) == []
    assert fake.seen == []


def test_long_output_is_cut_to_githubs_limit(make_rt: Any, github: tuple[FakeGitHub, str]) -> None:
    fake, url = github
    rt = make_rt(url, github_installation_id=77)
    run_id = seed_run(rt, level="L4", failures=1500, message="E" * 900 + "\nstack")
    (completed,) = finish(rt, run_id)
    assert sender.deliver(rt, completed).state == "sent", row(rt, completed).last_error
    (check,) = fake.check_runs.values()
    assert len(check.output["text"]) == 65_535
    assert check.output["text"].endswith("…[truncated]")
    assert len(check.annotations) == 1000


def test_primary_rate_limit_reschedules_at_the_reset_time(
    make_rt: Any, github: tuple[FakeGitHub, str]
) -> None:
    fake, url = github
    rt = make_rt(url, github_installation_id=77)
    (completed,) = finish(rt, seed_run(rt, level="L4"))
    reset = int(time.time()) + 900
    fake.rate_limited_once(reset)
    attempt = sender.deliver(rt, completed)
    message = row(rt, completed)
    assert attempt.state == message.state == "pending"  # rescheduled, not failed
    assert "rate limit" in (message.last_error or "") and "HTTP 403" in (message.last_error or "")
    assert aware(message.next_attempt_at) == datetime.fromtimestamp(reset, UTC)
    assert sender.deliver(rt, completed, now=datetime.fromtimestamp(reset - 1, UTC)).state is None
    assert sender.deliver(rt, completed, now=datetime.fromtimestamp(reset, UTC)).state == "sent"


def test_secondary_rate_limit_with_retry_after(
    make_rt: Any, github: tuple[FakeGitHub, str]
) -> None:
    fake, url = github
    rt = make_rt(url, github_installation_id=77)
    (completed,) = finish(rt, seed_run(rt, level="L4"))
    fake.script(
        403, {"retry-after": "60"}, {"message": "You have exceeded a secondary rate limit."}
    )
    before = datetime.now(UTC)
    assert sender.deliver(rt, completed).state == "pending"
    assert aware(row(rt, completed).next_attempt_at) >= before + timedelta(seconds=60)
    assert "secondary rate limit" in (row(rt, completed).last_error or "")


def test_a_failed_annotation_batch_resumes_without_repeating(
    make_rt: Any, github: tuple[FakeGitHub, str]
) -> None:
    fake, url = github
    rt = make_rt(url, github_installation_id=77)
    (completed,) = finish(rt, seed_run(rt, level="L4", failures=140))
    original = fake.answer
    patches = {"count": 0}

    def second_batch_fails_once(
        method: str, path: str, headers: dict[str, str], body: bytes
    ) -> Any:
        if method == "PATCH":
            patches["count"] += 1
            if patches["count"] == 1:
                return 502, {"content-type": "application/json"}, b'{"message": "bad gateway"}'
        return original(method, path, headers, body)

    fake.answer = second_batch_fails_once  # type: ignore[method-assign]
    assert sender.deliver(rt, completed).state == "pending"
    saved = row(rt, completed).result
    assert saved is not None and saved["annotations_sent"] == 50 and saved["main_done"] is True
    assert "HTTP 502" in (row(rt, completed).last_error or "")
    attempt = sender.deliver(rt, completed, now=aware(row(rt, completed).next_attempt_at))
    assert attempt.state == "sent", attempt.error
    (check,) = fake.check_runs.values()  # created once
    assert len(check.annotations) == 140
    assert len({a["title"] for a in check.annotations}) == 140  # none twice


def test_an_app_key_github_does_not_know_fails_with_its_answer(
    make_rt: Any, github: tuple[FakeGitHub, str]
) -> None:
    fake, url = github
    other_private, _ = rsa_key_pair()
    rt = make_rt(url, github_installation_id=77, github_app_private_key=other_private)
    (completed,) = finish(rt, seed_run(rt, level="L4"))
    assert sender.deliver(rt, completed).state == "failed"
    error = row(rt, completed).last_error or ""
    assert "HTTP 401" in error and "JSON web token could not be decoded" in error
    assert fake.check_runs == {}


def test_an_installation_token_near_expiry_is_replaced(make_rt: Any, tmp_path: Path) -> None:
    fake = FakeGitHub(APP_ID, PUBLIC_PEM, token_lifetime=30)  # inside our 60 s margin
    key_file = tmp_path / "app.pem"
    key_file.write_text(PRIVATE_PEM)
    with fake.running() as url:
        rt = make_rt(
            url,
            github_installation_id=77,
            github_app_private_key=None,
            github_app_private_key_file=key_file,
        )
        for _ in range(2):
            (completed,) = finish(rt, seed_run(rt, level="L4"))
            assert sender.deliver(rt, completed).state == "sent"
    assert fake.token_requests() == 2


def test_a_revoked_token_is_replaced_once(make_rt: Any, github: tuple[FakeGitHub, str]) -> None:
    fake, url = github
    rt = make_rt(url, github_installation_id=77)
    (first,) = finish(rt, seed_run(rt, level="L4"))
    assert sender.deliver(rt, first).state == "sent"
    with fake.lock:
        fake.tokens.clear()  # GitHub forgot every token it issued
    (second,) = finish(rt, seed_run(rt, level="L4"))
    assert sender.deliver(rt, second).state == "sent"
    assert fake.token_requests() == 2


def test_commit_statuses_with_a_plain_token(make_rt: Any, github: tuple[FakeGitHub, str]) -> None:
    fake, url = github
    fake.plain_token = "ghp_plain"
    rt = make_rt(url, github_token="ghp_plain")
    run_id = seed_run(rt, level="L4", failures=3)
    (started,) = start(rt, run_id)
    assert sender.deliver(rt, started).state == "sent"
    (completed,) = finish(rt, run_id)
    assert sender.deliver(rt, completed).state == "sent"
    ((key, posted),) = fake.statuses.items()
    assert key[0] == "sample/pytorch" and key[2] == "ci-relay / test (cpu)"
    assert [p["state"] for p in posted] == ["pending", "failure"]
    assert posted[1]["target_url"] == f"https://relay.example/runs/{run_id}"


def test_statuses_stop_at_githubs_1000_per_sha_and_context(
    make_rt: Any, github: tuple[FakeGitHub, str]
) -> None:
    fake, url = github
    fake.plain_token = "ghp_plain"
    rt = make_rt(url, github_token="ghp_plain")
    run_id = seed_run(rt, level="L4")
    (completed,) = finish(rt, run_id)
    key = row(rt, completed).key
    with rt.db.session() as s:  # 1,000 statuses already posted for this sha and context
        s.add_all(
            OutboxMessage(run_id=run_id, target="github", key=key, state="sent", payload={})
            for _ in range(1000)
        )
    assert sender.deliver(rt, completed).state == "failed"
    assert "at most 1000" in (row(rt, completed).last_error or "")
    assert fake.seen == []
    with rt.db.session() as s:
        assert (
            s.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(OutboxMessage.state == "failed")
            )
            == 1
        )
