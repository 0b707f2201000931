"""Which functions a test executed, from ``sys.monitoring`` (Python 3.12+): each function's
first calls in a test are seen, then that function is silenced until the next test.

cProfile (the recorder's other way) pays for every call; a test of a parser calls the same
few functions hundreds of thousands of times, which made recording cost 3x plain pytest on
call-heavy code. Here a function costs at most ``CALLS_SEEN`` callbacks per test, whatever it
calls. The distance from the test is read at those calls by walking the frames up to the
test's own file, and the shortest kept (cProfile keeps the shortest of all the calls it saw).
``sys.monitoring`` sees every thread, so the work a test hands to a thread (a web
framework's test client) is recorded too, at the farthest distance when no frame of the test
is above it. With ``lines``, each line's first run in a test is kept the same way (one
callback per line per test, where a line tracer pays for every run of it).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from test_selection.coverage.map import MAX_DEPTH, Function

TOOL_NAME = "ci-relay coverage"
# sys.monitoring's tool ids without a predefined user (0 debugger, 1 coverage, 2 profiler,
# 5 optimizer): a test that starts cProfile (the profiler's id) or coverage.py still can
TOOL_IDS = (4, 3)
CALLS_SEEN = 8  # calls of a function per test whose distance is read (then it is silenced)


def free_tool() -> int | None:
    """A free tool id on a Python with ``sys.monitoring`` (3.12+), else None."""
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None:
        return None
    return next((i for i in TOOL_IDS if monitoring.get_tool(i) is None), None)


def available() -> bool:
    return free_tool() is not None


class FirstCalls:
    """One session's monitor; :meth:`start` begins a test's record, :meth:`read` takes it."""

    def __init__(self, namer: Callable[[str], str | None], lines: bool = False) -> None:
        monitoring: Any = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        self.monitoring = monitoring
        tool = free_tool()
        if tool is None:
            raise ValueError("no free sys.monitoring tool id")
        self.tool = tool
        self.namer = namer
        self.test_file: str | None = None
        self.seen: dict[Function, int] = {}
        self.calls: dict[Function, int] = {}
        self.lines: dict[str, set[int]] | None = {} if lines else None
        self.on = False
        self.events = monitoring.events.PY_START | (monitoring.events.LINE if lines else 0)
        monitoring.use_tool_id(self.tool, TOOL_NAME)
        monitoring.register_callback(self.tool, monitoring.events.PY_START, self._started)
        if lines:
            monitoring.register_callback(self.tool, monitoring.events.LINE, self._line)

    def start(self, test_file: str | None) -> None:
        """Record a new test: every function and line may report its first run again. The
        events stay on between tests (what runs there goes to the test before): switching
        them on and off re-instruments every function the next time it runs, which cost
        more than the callbacks it saved."""
        self.test_file = test_file
        self.seen = {}
        self.calls = {}
        if self.lines is not None:
            self.lines = {}
        self.monitoring.restart_events()
        if not self.on:
            self.monitoring.set_events(self.tool, self.events)
            self.on = True

    def read(self) -> dict[Function, int]:
        return self.seen

    def read_lines(self) -> dict[str, set[int]] | None:
        """The test's lines per file of the upstream (None: lines are not recorded)."""
        return self.lines

    def close(self) -> None:
        self.monitoring.set_events(self.tool, 0)
        self.monitoring.register_callback(self.tool, self.monitoring.events.PY_START, None)
        if self.lines is not None:
            self.monitoring.register_callback(self.tool, self.monitoring.events.LINE, None)
        self.monitoring.free_tool_id(self.tool)

    def _started(self, code: types.CodeType, offset: int) -> Any:
        name = self.namer(code.co_filename)
        if name is None or code.co_name == "<module>":
            return self.monitoring.DISABLE
        function = (name, code.co_qualname)
        distance = self._distance(sys._getframe(1))
        known = self.seen.get(function)
        if known is None or distance < known:
            self.seen[function] = distance
        calls = self.calls[function] = self.calls.get(function, 0) + 1
        # a few calls more may come by a shorter way (the first is often through set-up)
        return self.monitoring.DISABLE if distance <= 1 or calls >= CALLS_SEEN else None

    def _line(self, code: types.CodeType, number: int) -> Any:
        """A line's first run in the test (then silent until the next test)."""
        name = self.namer(code.co_filename)
        # code compiled from a syntax tree without positions runs "line 0": no line of the file
        if name is not None and self.lines is not None and number > 0:
            self.lines.setdefault(name, set()).add(number)
        return self.monitoring.DISABLE

    def _distance(self, frame: types.FrameType | None) -> int:
        """Calls from the nearest frame of the test's own file (a function of that file is
        at 1, as the profiler counts); none above within ``MAX_DEPTH``: the farthest."""
        steps = 0
        while frame is not None and steps < MAX_DEPTH:
            if (
                self.test_file is not None
                and self.namer(frame.f_code.co_filename) == self.test_file
            ):
                return max(1, steps)
            frame = frame.f_back
            steps += 1
        return MAX_DEPTH
