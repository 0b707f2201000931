"""How a pytest report reads as an outcome of a reuse-spec run (shared by every reporter)."""

from __future__ import annotations

import pytest

from ci_relay.execution.excerpt import head_and_tail

OUTCOMES = ("passed", "failed", "xfailed", "xpassed", "xpass_strict", "skipped", "error", "crashed")
BAD_OUTCOMES = frozenset({"failed", "xpass_strict", "error", "crashed"})
# a test's failure text as stored: enough for any real traceback, bounded for a runaway repr
MAX_DETAILS_BYTES = 64 * 1024


def is_final(report: pytest.TestReport) -> bool:
    """The report that settles a test: its call, a setup that did not pass, a failed teardown."""
    if report.when == "call":
        return True
    return not report.passed if report.when == "setup" else report.failed


def classify(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        if report.when != "call":
            return "error"
        return "xpass_strict" if "XPASS(strict)" in report.longreprtext else "failed"
    return "skipped" if report.skipped else "passed"


def short_message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0][:300]
    if isinstance(report.longrepr, tuple):  # skip: (path, line, reason)
        return str(report.longrepr[2])[:300]
    return report.longreprtext.strip().splitlines()[-1][:300] if report.longreprtext else ""


def collection_failure(report: pytest.CollectReport) -> tuple[str, str, str]:
    """A file that could not be collected, as a result of its own: (nodeid, message, details).
    Its tests cannot run; the other files' still do (``--continue-on-collection-errors``)."""
    text = report.longreprtext.replace("\x00", "\\x00")
    last = [line for line in text.strip().splitlines() if line.startswith("E ")][-1:]
    message = f"collection error: {(last[0][1:].strip() if last else 'see details')[:280]}"
    return report.nodeid, message, head_and_tail(text, MAX_DETAILS_BYTES)


def failure_details(report: pytest.TestReport) -> str:
    """Everything pytest says about a test that broke (its longrepr), head and tail kept
    within 64 KB; empty for the rest. NUL is spelled out: PostgreSQL text cannot hold it."""
    if not report.failed:
        return ""
    return head_and_tail(report.longreprtext.replace("\x00", "\\x00"), MAX_DETAILS_BYTES)
