"""A failure's full text, from the shard process to the database, the reports and the dashboard.

The end-to-end test runs a real shard (``pipeline.execute_shard``, local runtime, a real
upstream git repository) whose tests fail in a helper, fail with a 200 KB message,
segfault and hang; then the run is closed and its CRCR report sent by the real sender to
a loopback receiver, and the dashboard is read through the real app.
"""

from __future__ import annotations

import json
import re
import secrets
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.execution.excerpt import head_and_tail
from ci_relay.execution.junit import write_junit
from ci_relay.execution.outcomes import MAX_DETAILS_BYTES
from ci_relay.execution.spec_run import TestOutcome
from ci_relay.reporting import sender
from ci_relay.reporting.caps import Budget, failed_test
from ci_relay.reporting.github import AppAuth
from ci_relay.service.app import create_app
from ci_relay.store.models import Change, Delivery, Run, Shard, TestResult
from tests.gitrepo import GitRepo
from tests.relay_fixtures import make_settings
from tests.reporting_fakes import CallbackReceiver, CheckRun, FakeGitHub, rsa_key_pair, seed_run

UPSTREAM_TEST = """
import os
import signal
import time

from torch.testing._internal.common_utils import TestCase


def helper_deep_in_the_stack(values):
    marker = "<b>helper-frame-marker</b>"
    assert values == [1, 2, 3], f"values differ: {values!r} {marker}"


class TestDetails(TestCase):
    def test_ok(self):
        pass

    def test_fails_in_a_helper(self):
        helper_deep_in_the_stack([1, 2, 4])

    def test_huge_message(self):
        raise AssertionError("start-of-huge " + "y" * 200_000 + " end-of-huge")

    def test_segfault(self):
        os.kill(os.getpid(), signal.SIGSEGV)

    def test_hang(self):
        time.sleep(3600)
"""
SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_details.py
      unlisted_test_mode: mandatory_success
"""
CLASS = "test/test_details.py::TestDetails"
TESTS = ["test_ok", "test_fails_in_a_helper", "test_huge_message", "test_segfault", "test_hang"]
TOKEN = "crcr-token"


def _run_for(rt: RelayContext, head: str) -> tuple[int, int]:
    """A change and a running run with one pending shard of the test file, as ``select``
    leaves them; (run id, shard id)."""
    payload = {
        "action": "synchronize",
        "number": 3,
        "pull_request": {"number": 3, "head": {"sha": head}, "labels": []},
        "repository": {"full_name": "sample/pytorch"},
    }
    with rt.db.session() as s:
        delivery = Delivery(
            source="github",
            hook_id="1",
            delivery_id=secrets.token_hex(8),
            event="pull_request",
            action="synchronize",
            repository="sample/pytorch",
            head_sha=head,
            state="processed",
            headers={},
            body=json.dumps(payload).encode(),
        )
        change = Change(
            delivery=delivery,
            repository="sample/pytorch",
            kind="pull_request",
            number=3,
            head_sha=head,
        )
        run = Run(change=change, backend="cpu", level="L2", state="running")
        shard = Shard(run=run, index=0, test_files=[f"{CLASS}::{n}" for n in TESTS])
        s.add_all([delivery, change, run, shard])
        s.flush()
        return run.id, shard.id


@pytest.fixture
def shard_run(
    database_url: str, tmp_path: Path
) -> Iterator[tuple[RelayContext, int, CallbackReceiver]]:
    """The shard executed for real, the run collected, its CRCR report sent."""
    upstream = GitRepo(tmp_path / "upstream")
    head = upstream.commit("tests that break", {"test/test_details.py": UPSTREAM_TEST})
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    receiver = CallbackReceiver(TOKEN)
    with receiver.running() as url:
        rt = RelayContext(
            make_settings(
                database_url,
                tmp_path,
                upstream_repo=str(upstream.path),
                specs=[spec],
                runtime="local",
                per_test_timeout=5,
                crcr_callback_url=url + "/callback",
                crcr_callback_token=TOKEN,
                public_url="https://relay.example",
            )
        )
        rt.db.upgrade()
        try:
            run_id, shard_id = _run_for(rt, head)
            assert pipeline.execute_shard(rt, shard_id, timedelta(hours=1))
            (report,) = [step.arg for step in pipeline.collect(rt, run_id) if step.task == "report"]
            assert sender.deliver(rt, report).state == "sent"
            yield rt, run_id, receiver
        finally:
            rt.db.dispose()


def _stored(rt: RelayContext) -> dict[str, TestResult]:
    with rt.db.session() as s:
        return {r.nodeid.rsplit("::", 1)[1]: r for r in s.scalars(select(TestResult))}


def test_a_real_failure_reaches_the_database_the_crcr_body_and_the_dashboard(
    shard_run: tuple[RelayContext, int, CallbackReceiver],
) -> None:
    rt, run_id, receiver = shard_run
    stored = _stored(rt)
    assert {name: r.outcome for name, r in stored.items()} == {
        "test_ok": "passed",
        "test_fails_in_a_helper": "failed",
        "test_huge_message": "failed",
        "test_segfault": "crashed",
        "test_hang": "crashed",
    }
    assert stored["test_ok"].details is None

    helper = stored["test_fails_in_a_helper"]
    assert helper.message is not None and helper.message.startswith("AssertionError: values")
    assert "helper_deep_in_the_stack" not in helper.message  # the one line a list shows
    details = helper.details or ""
    # the traceback: the test's frame, the helper's source, the error and where it was raised
    assert "helper_deep_in_the_stack([1, 2, 4])" in details
    assert "def helper_deep_in_the_stack(values):" in details
    assert "values differ: [1, 2, 4] <b>helper-frame-marker</b>" in details
    # pytest's own comparison, not a crash inside pytest (it needs its terminal reporter)
    assert "assert [1, 2, 4] == [1, 2, 3]" in details and "At index 2 diff: 4 != 3" in details
    assert "terminalreporter" not in details
    assert "test_details.py:10: AssertionError" in details

    huge = stored["test_huge_message"].details or ""
    assert len(huge.encode()) <= MAX_DETAILS_BYTES
    assert "start-of-huge" in huge and "end-of-huge" in huge and "bytes cut]" in huge

    segfault = stored["test_segfault"]
    assert segfault.message == "the test process died of SIGSEGV"
    crash = segfault.details or ""
    assert crash.startswith("the test process died of SIGSEGV\n\n")
    assert "Fatal Python error: Segmentation fault" in crash
    assert 'test_details.py", line 24 in test_segfault' in crash  # faulthandler's stack
    hang = stored["test_hang"].details or ""
    assert hang.startswith("the test ran longer than its 5s timeout and was killed\n\n")
    assert "Timeout (0:00:05)!" in hang and 'test_details.py", line 27 in test_hang' in hang

    # the CRCR callback carries the traceback as stacktrace (within 4 KB), the line as message
    (body,) = receiver.accepted
    listed = {t["name"].rsplit("::", 1)[1]: t for t in body["workflow"]["failed_tests"]}
    assert sorted(listed) == [
        "test_fails_in_a_helper",
        "test_hang",
        "test_huge_message",
        "test_segfault",
    ]
    entry = listed["test_fails_in_a_helper"]
    assert entry["message"] == helper.message
    assert "def helper_deep_in_the_stack(values):" in entry["stacktrace"]
    assert "test_details.py:10: AssertionError" in entry["stacktrace"]
    for name in ("test_huge_message", "test_segfault", "test_hang"):
        assert 3000 < len(listed[name]["stacktrace"].encode()) <= 4096, name
    assert listed["test_huge_message"]["stacktrace"].rstrip().endswith("AssertionError")
    assert "Fatal Python error: Segmentation fault" in listed["test_segfault"]["stacktrace"]

    # the dashboard: the text folded under each failure, escaped; the long one a link away
    with TestClient(create_app(rt, lambda steps: None)) as client:
        page = client.get(f"/runs/{run_id}").text
        assert "&lt;b&gt;helper-frame-marker&lt;/b&gt;" in page
        assert "<b>helper-frame-marker</b>" not in page
        assert page.count("full failure text") == 4
        assert "def helper_deep_in_the_stack(values):" in page
        assert "Fatal Python error: Segmentation fault" in page
        huge_id = stored["test_huge_message"].id
        assert f'href="/api/results/{huge_id}/details"' in page
        whole = client.get(f"/api/results/{huge_id}/details")
        assert whole.status_code == 200 and whole.text == huge
        assert whole.headers["content-type"].startswith("text/plain")
        assert whole.headers["x-content-type-options"] == "nosniff"
        view = client.get(f"/api/runs/{run_id}/view").json()
        failures = {f["nodeid"].rsplit("::", 1)[1]: f for f in view["run"]["failures"]}
        assert failures["test_fails_in_a_helper"]["details"] == details
        assert failures["test_huge_message"]["details_cut"] is True
        assert failures["test_huge_message"]["details_length"] == len(huge)
        raw = client.get(f"/api/runs/{run_id}").json()
        by_name = {r["nodeid"].rsplit("::", 1)[1]: r for r in raw["shards"][0]["results"]}
        assert by_name["test_segfault"]["details"] == crash
        assert client.get("/api/results/999999/details").status_code == 404


def test_head_and_tail_keeps_both_ends_within_the_limit() -> None:
    text = "first line\n" + "\n".join(f"frame {i} é" for i in range(5000)) + "\nError: last"
    cut = head_and_tail(text, 4096)
    assert len(cut.encode()) <= 4096 and len(cut.encode()) > 3500
    assert cut.startswith("first line\nframe 0 é\n") and cut.endswith("\nError: last")
    assert "bytes cut]" in cut
    assert all(line.startswith(("frame", "first", "Error", "…[")) for line in cut.splitlines())
    assert head_and_tail("short", 4096) == "short"
    assert len(head_and_tail("é" * 100, 7).encode()) <= 7


def test_a_failed_test_reports_the_details_else_a_multi_line_message() -> None:
    details = "Traceback: the_test\n" + "x" * 9000 + "\nValueError: bad"
    entry = failed_test("t.py::T::test", "failed", "ValueError: bad", Budget(), details)
    assert entry.message == "ValueError: bad"
    assert entry.stacktrace is not None
    assert entry.stacktrace.startswith("Traceback: the_test")
    assert entry.stacktrace.endswith("ValueError: bad")
    assert len(entry.stacktrace.encode()) <= 4096
    older = failed_test("t.py::T::test", "failed", "one\ntwo", Budget(), None)  # stored before
    assert older.message == "one" and older.stacktrace == "one\ntwo"
    assert failed_test("t.py::T::test", "failed", "one", Budget(), None).stacktrace is None
    assert (
        failed_test("t.py::T::test", "failed", "x", Budget(stack_bytes=0), details).stacktrace
        is None
    )


APP_ID = "424242"
PRIVATE_PEM, PUBLIC_PEM = rsa_key_pair()


def _check_run(database_url: str, tmp_path: Path, failures: int, details: str) -> CheckRun:
    """An L4 run with ``failures`` failing tests, reported to a loopback GitHub as a check."""
    AppAuth.forget()
    fake = FakeGitHub(APP_ID, PUBLIC_PEM)
    with fake.running() as url:
        settings: dict[str, Any] = {
            "github_api_url": url,
            "public_url": "https://relay.example",
            "github_app_id": APP_ID,
            "github_app_private_key": PRIVATE_PEM,
        }
        rt = RelayContext(make_settings(database_url, tmp_path, **settings))
        rt.db.upgrade()
        try:
            run_id = seed_run(
                rt,
                level="L4",
                failures=failures,
                message="AssertionError: assert 1 == 2",
                details=details,
            )
            reports = [step.arg for step in pipeline.collect(rt, run_id) if step.task == "report"]
            assert [sender.deliver(rt, i).state for i in reports] == ["sent"]
        finally:
            rt.db.dispose()
            AppAuth.forget()
    (check,) = fake.check_runs.values()
    return check


def test_github_check_run_folds_each_traceback_under_its_failure(
    database_url: str, tmp_path: Path
) -> None:
    details = (
        "def test_x():\n>       assert f() == 2\nE       assert 1 == 2\n\nt.py:3: AssertionError"
    )
    check = _check_run(database_url, tmp_path, 3, details)
    assert len(check.annotations) == 3
    assert all(a["raw_details"] == details for a in check.annotations)
    assert all(a["message"] == "AssertionError: assert 1 == 2" for a in check.annotations)
    text = check.output["text"]
    assert text.count("<details><summary><code>test/test_ops.py::TestOpsCPU::test_bad_") == 3
    assert text.count("E       assert 1 == 2") == 3
    assert "more traceback" not in text


def test_tracebacks_that_do_not_fit_never_cut_the_list_of_failures(
    database_url: str, tmp_path: Path
) -> None:
    details = "Traceback\n" + "  frame ```x```\n" * 2000 + "AssertionError"
    check = _check_run(database_url, tmp_path, 60, details)
    text = check.output["text"]
    assert len(text) <= 65_535
    listed = re.findall(r"^- `(test/test_ops.py::TestOpsCPU::test_bad_\d+)`", text, re.M)
    assert len(listed) == 60  # every failure is listed
    shown = text.count("<details><summary>")
    assert 0 < shown < 60 and f"{60 - shown} more traceback(s): https://relay.example/runs/" in text
    assert "````\n" in text  # a fence longer than the backticks inside it
    assert all(len(a["raw_details"].encode()) <= 8 * 1024 for a in check.annotations)


def test_junit_carries_the_failure_text_as_valid_xml(tmp_path: Path) -> None:
    details = "Traceback:\n  \x1b[31mred\x1b[0m frame\nAssertionError: 1 != 2"
    path = tmp_path / "junit.xml"
    write_junit(
        path,
        [
            TestOutcome(
                "t.py::T::test_a", "failed", None, 0.1, "AssertionError: 1 != 2", details=details
            ),
            TestOutcome(
                "t.py::T::test_b", "crashed", None, 0.0, "died of SIGSEGV", details="died\n\nstack"
            ),
            TestOutcome("t.py::T::test_c", "passed", None, 0.1),
        ],
    )
    cases = {c.get("name"): c for c in ET.parse(path).iter("testcase")}
    failure = cases["test_a"].find("failure")
    assert failure is not None and failure.get("message") == "AssertionError: 1 != 2"
    assert failure.text == details.replace("\x1b", "\ufffd")
    error = cases["test_b"].find("error")
    assert error is not None and error.text == "died\n\nstack"
    assert list(cases["test_c"]) == []
