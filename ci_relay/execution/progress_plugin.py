"""pytest plugin: a crash-proof progress log and a per-test timeout.

Every test's start and result (with the failure's full text) go to an append-only log (one
JSON line each, unbuffered by the OS), so when the process dies — segfault, OOM kill,
timeout — the shard runner still knows every finished result and which test was running.

What costs per test is kept to one ``write`` and no thread (issue 37: on a slow or loaded
machine a per-test thread handoff cost milliseconds, times 25,000 variants):

- A test's result and end are written with the next test's start, in one ``write``, and the
  last test's as its protocol ends. A crash is always attributed from the log's last start,
  so nothing is lost: a test whose process dies in its teardown was recorded as crashed
  (replacing its result) before, and still is.
- The timeout is ``faulthandler``'s watchdog thread, which fires even when the test is stuck
  in C code holding the GIL, and ends the process. Arming it starts a thread (and the previous
  arm's thread is joined), so it is re-armed at a test's start only when its last arm is more
  than ``REARM_SLACK`` old: every test still gets at least its timeout minus that slack (1 s,
  or 1 % of a short timeout), and a shard of fast tests arms it about once a second instead
  of once per test. It is cancelled once, when the last test ends. pytest's faulthandler
  plugin cancels it after every failure, so a failure re-arms it at once.
"""

from __future__ import annotations

import faulthandler
import json
import os
import time
from collections.abc import Generator
from typing import Any

import pytest

from ci_relay.execution.outcomes import (
    classify,
    collection_failure,
    failure_details,
    is_final,
    short_message,
)
from reuse_specs.pytest_plugin import NOTE_PROPERTY

TIMEOUT_EXIT = "per-test timeout"
REARM_SLACK = 1.0  # seconds; at most 1 % of the timeout


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ci-relay progress")
    group.addoption("--progress-log", default=None, metavar="FILE")
    group.addoption("--per-test-timeout", type=float, default=None, metavar="SECONDS")


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event) + "\n").encode()


class ProgressLog:
    def __init__(self, path: str, timeout: float | None) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.timeout = timeout
        self.slack = min(REARM_SLACK, timeout / 100) if timeout else 0.0
        self.armed_at: float | None = None  # monotonic time of the watchdog's last arm
        self.pending: list[bytes] = []  # the last test's result and end, not yet written

    def write(self, event: dict[str, Any]) -> None:
        """``event`` now, after what is pending (the log stays in order)."""
        self.pending.append(_line(event))
        self.flush()

    def flush(self) -> None:
        if self.pending:
            data, self.pending = b"".join(self.pending), []
            while data:  # a regular file takes it whole; a signal may cut a write short
                data = data[os.write(self.fd, data) :]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # the file's own result: its tests cannot run, the rest do
            nodeid, message, details = collection_failure(report)
            self.write(
                {
                    "event": "result",
                    "nodeid": nodeid,
                    "outcome": "error",
                    "mode": None,
                    "duration": 0.0,
                    "message": message,
                    "details": details,
                }
            )

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.write({"event": "start", "nodeid": nodeid})  # with the last test's result and end
        if self.timeout:
            self._arm()

    def _arm(self) -> None:
        now = time.monotonic()
        if self.armed_at is not None and now - self.armed_at < self.slack:
            return  # fires no earlier than timeout - slack after this test's start
        assert self.timeout is not None
        faulthandler.dump_traceback_later(self.timeout, exit=True, file=self.fd)
        self.armed_at = now

    @pytest.hookimpl(trylast=True)
    def pytest_exception_interact(self) -> None:
        """pytest's own faulthandler plugin cancels the watchdog here (after every failed
        phase, tryfirst); arm it again at once, or the next tests within the slack, and this
        one's teardown, would run with no timeout at all (a hang after a failure hung the
        shard until its wall-clock limit)."""
        if self.armed_at is not None:
            self.armed_at = None
            self._arm()

    @pytest.hookimpl(trylast=True)
    def pytest_enter_pdb(self) -> None:
        self.armed_at = None  # cancelled for a person debugging; the next test arms it again

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if is_final(report):
            props = dict(report.user_properties)
            self.pending.append(
                _line(
                    {
                        "event": "result",
                        "nodeid": report.nodeid,
                        "outcome": classify(report),
                        "mode": props.get("reuse_spec.mode"),
                        "duration": report.duration,
                        "message": "" if report.passed else short_message(report),
                        "details": failure_details(report),
                        "note": props.get(NOTE_PROPERTY) or "",
                    }
                )
            )

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.pending.append(_line({"event": "end", "nodeid": nodeid}))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, None, None]:
        yield
        if nextitem is None:  # the last test (of this process): nothing starts after it
            self._done()

    def _done(self) -> None:
        if self.armed_at is not None:
            faulthandler.cancel_dump_traceback_later()
            self.armed_at = None
        self.flush()

    def pytest_sessionfinish(self) -> None:
        self._done()  # a run stopped early (-x, a keyboard interrupt) ends without a last test

    def pytest_unconfigure(self) -> None:
        self._done()
        os.close(self.fd)


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("progress_log")
    if path:
        config.pluginmanager.register(
            ProgressLog(path, config.getoption("per_test_timeout")), "ci-relay-progress"
        )
