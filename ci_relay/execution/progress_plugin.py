"""pytest plugin: a crash-proof progress log and a per-test timeout.

Every test's start and result (with the failure's full text) are appended
(unbuffered, one JSON line each) as they happen, so when the process dies —
segfault, OOM kill, timeout — the shard runner still knows every finished
result and which test was running.
The timeout uses ``faulthandler``'s watchdog thread, which fires even when the
test is stuck in C code holding the GIL, and ends the process.
"""

from __future__ import annotations

import faulthandler
import json
import os
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


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ci-relay progress")
    group.addoption("--progress-log", default=None, metavar="FILE")
    group.addoption("--per-test-timeout", type=float, default=None, metavar="SECONDS")


class ProgressLog:
    def __init__(self, path: str, timeout: float | None) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.timeout = timeout

    def write(self, event: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(event) + "\n").encode())

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
        self.write({"event": "start", "nodeid": nodeid})
        if self.timeout:
            faulthandler.dump_traceback_later(self.timeout, exit=True, file=self.fd)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        final = is_final(report)
        if final:
            props = dict(report.user_properties)
            self.write(
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

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if self.timeout:
            faulthandler.cancel_dump_traceback_later()
        self.write({"event": "end", "nodeid": nodeid})

    def pytest_unconfigure(self) -> None:
        os.close(self.fd)


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("progress_log")
    if path:
        config.pluginmanager.register(
            ProgressLog(path, config.getoption("per_test_timeout")), "ci-relay-progress"
        )
