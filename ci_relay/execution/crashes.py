"""The progress log's events, why a test process died mid-test, and the failure text its
crashed test gets.

Shared by the shard runner (the whole child process died: a quota kill, the shard's wall
clock, or a crash it could not restart from) and by the child itself, which restarts its own
test process after a crash without collecting the files again (:mod:`.progress_plugin`).
"""

from __future__ import annotations

import json
import signal

from ci_relay.execution.excerpt import head_and_tail
from ci_relay.execution.outcomes import MAX_DETAILS_BYTES

FATAL = "Fatal Python error"  # how faulthandler starts the stack it prints on a fatal signal
OUTPUT_TAIL_BYTES = 4000  # of a dead process's output, when it printed no stack
TIMEOUT_MARK = "Timeout ("  # how faulthandler's watchdog starts the stack it writes
EVENTS = ("start", "result", "end")


def read_events(text: str) -> list[dict[str, object]]:
    """The log's well-formed events; the test code shares the child's process and can
    write anything there, so a line that is not one of ours is dropped, never trusted."""
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the crash
            if (
                isinstance(event, dict)
                and event.get("event") in EVENTS
                and isinstance(event.get("nodeid"), str)
                and (event["event"] != "result" or isinstance(event.get("outcome"), str))
            ):
                events.append(event)
    return events


def after_last_start(progress_text: str) -> str:
    """The progress log after the last test's start line: what was written while it ran."""
    last_start = progress_text.rfind('"event": "start"')
    return progress_text[last_start:].split("\n", 1)[1] if last_start >= 0 else ""


def why_it_died(
    returncode: int,
    timeout: float,
    progress_text: str,
    killed_for: str | None = None,
    timed_out: bool = False,
) -> str:
    """The reason a crashed test's record gives, from how its process ended."""
    if killed_for:
        return f"the test {killed_for} and was killed"
    if timed_out:
        return "the shard hit its wall-clock limit"
    if TIMEOUT_MARK in after_last_start(progress_text):  # the watchdog wrote the stuck stack
        return f"the test ran longer than its {timeout:g}s timeout and was killed"
    signum = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if signum:
        try:
            return f"the test process died of {signal.Signals(signum).name}"
        except ValueError:
            pass
    return f"the test process exited with status {returncode} mid-test"


def dying_words(progress_text: str, output: str) -> str:
    """Where the process was when it died: the stack faulthandler's watchdog wrote into the
    progress log at a timeout, else the one it printed on a fatal signal, else its last output."""
    after = after_last_start(progress_text)
    stack = "\n".join(line for line in after.splitlines() if not line.startswith("{"))
    if stack.strip():
        return stack.strip()
    fatal = output.rfind(FATAL)
    if fatal >= 0:
        return output[fatal:].strip()
    tail = output.encode()[-OUTPUT_TAIL_BYTES:].decode("utf-8", "ignore").strip()
    return f"last output of the test process:\n{tail}" if tail else ""


def crash_details(reason: str, progress_text: str, output: str) -> str:
    """A crashed test's failure text: why it was recorded as crashed, then its stack."""
    stack = dying_words(progress_text, output).replace("\x00", "\\x00")
    return head_and_tail(f"{reason}\n\n{stack}" if stack else reason, MAX_DETAILS_BYTES)
