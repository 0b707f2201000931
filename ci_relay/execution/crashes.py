"""The progress log's events, why a test process died mid-test, and the failure text its
crashed test gets.

Shared by the shard runner (the whole child process died: a quota kill, the shard's wall
clock, or a crash it could not restart from) and by the child itself, which restarts its own
test process after a crash without collecting the files again (:mod:`.crash_restarts`).
Both read the log as a stream (:class:`ProgressReader`): a 25k-variant shard's log is tens of
megabytes, and neither side needs more of it at once than one chunk and the last test's text.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

from ci_relay.execution.excerpt import head_and_tail
from ci_relay.execution.outcomes import MAX_DETAILS_BYTES

FATAL = "Fatal Python error"  # how faulthandler starts the stack it prints on a fatal signal
OUTPUT_TAIL_BYTES = 4000  # of a dead process's output, when it printed no stack
TIMEOUT_MARK = "Timeout ("  # how faulthandler's watchdog starts the stack it writes
EVENTS = ("start", "result", "end")
READ_BYTES = 8 * 1024 * 1024  # of a progress log read at once
SINCE_START_BYTES = 1024 * 1024  # of what followed the last start line (a crash quotes it)


def parse_event(line: str) -> dict[str, object] | None:
    """One log line as our event, or None: the test code shares the child's process and can
    write anything there, so a line that is not one of ours is dropped, never trusted."""
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None  # a line cut by the crash
    if (
        isinstance(event, dict)
        and event.get("event") in EVENTS
        and isinstance(event.get("nodeid"), str)
        and (event["event"] != "result" or isinstance(event.get("outcome"), str))
    ):
        return event
    return None


def open_log(path: Path | str) -> int | None:
    """A read descriptor on a progress log if it is a regular file (never a FIFO or a
    symlink the test code put in its place)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


class ProgressReader:
    """Reads a progress log from ``offset`` as it grows, whole lines only, each once.

    :meth:`read` returns the well-formed events written since the last call (at most
    READ_BYTES of log per call); :attr:`since_start` is the text from the last test's start
    line on (capped), which is where a dying process's stack and the watchdog's go. Nothing
    else is kept."""

    def __init__(self, path: Path | str, offset: int = 0) -> None:
        self.path, self.offset, self.partial = path, offset, b""
        self.events = 0  # well-formed events read so far
        self.running: str | None = None  # started, not yet ended
        self._since: list[str] = []
        self._since_bytes = 0

    @property
    def since_start(self) -> str:
        return "".join(line + "\n" for line in self._since)

    def read(self) -> list[dict[str, object]]:
        fd = open_log(self.path)
        if fd is None:
            return []
        try:
            os.lseek(fd, self.offset, os.SEEK_SET)
            chunk = os.read(fd, READ_BYTES)
        finally:
            os.close(fd)
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        if len(self.partial) > READ_BYTES:  # one endless line: not an event
            self.partial = b""
        return self._take(lines)

    def drain(self) -> Iterator[list[dict[str, object]]]:
        """Every event left in the log once its writer has ended, a chunk at a time (up to
        the size it has now: a stray process still writing cannot keep this going); its last
        line counts even without a newline (a stack cut by the crash)."""
        fd = open_log(self.path)
        if fd is None:
            return
        try:
            end = os.fstat(fd).st_size
        finally:
            os.close(fd)
        while self.offset < end:
            before = self.offset
            yield self.read()
            if self.offset == before:
                break  # replaced or truncated under us
        if self.partial:
            last, self.partial = self.partial, b""
            yield self._take([last])

    def _take(self, lines: list[bytes]) -> list[dict[str, object]]:
        events = []
        for raw in lines:
            line = raw.decode(errors="replace")
            event = parse_event(line)
            if event is not None:
                events.append(event)
                if event["event"] == "start":
                    self.running = str(event["nodeid"])
                    self._since, self._since_bytes = [], 0
                elif event["event"] == "end":
                    self.running = None
            if (self.running is not None or self._since) and (
                self._since_bytes < SINCE_START_BYTES
            ):
                self._since.append(line)
                self._since_bytes += len(raw) + 1
        self.events += len(events)
        return events


def after_last_start(progress_text: str) -> str:
    """The progress log after the last test's start line: what was written while it ran."""
    last_start = progress_text.rfind('"event": "start"')
    return progress_text[last_start:].partition("\n")[2] if last_start >= 0 else ""


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
