"""pytest plugin for the shard child: a crash costs one test, not a re-collection.

Collecting a big upstream file (importing it, creating its device and dtype variants) takes
seconds to tens of seconds; a shard restarted after each crash paid it again every time. With
this plugin the collected process only supervises: it forks a test process that runs the
remaining items, and when that one dies mid-test (a fatal signal, the per-test timeout's exit,
``os._exit`` in test code) it records the running test as crashed in the progress log, as the
shard runner would, and forks the next one from the same collected state, starting at the test
after the crashed one.

torch's OpenMP pool is not fork-safe once it has threads, so the supervisor keeps torch at one
thread while it collects (a module may run ops at import) and each test process gets the
machine's count back. The shard runner stays the backstop: if the supervisor itself dies, or
after ``MAX_CRASHES`` crashes, it leaves the crash unrecorded and exits, and the runner restarts
the whole child as before.

The supervisor is the subreaper of its test processes' descendants: what a test process left
running when it ended (a fork bomb's processes, a server it started, then the test timed out)
comes back to the supervisor, which kills and reaps it before it forks the next test process,
so the next test starts with the sandbox's process limit free and no stranger running beside
it (before, they lived until the whole child ended).

What every test process would import on its first test is imported once, before the first fork
(``FIRST_TEST_IMPORTS``): torch's ``TestCase`` sets the compiler stance when it runs a test,
which imports ``torch._dynamo`` (1-3 s of CPU); done in each test process, a crash cost that
again, and under load the next test could pass its timeout before its body ran.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import importlib
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

import pytest

from ci_relay.execution.crashes import ProgressReader, crash_details, why_it_died

# module the collected tests use -> what their first test imports (then cached in the
# supervisor, shared with every forked test process)
FIRST_TEST_IMPORTS = {"torch.testing._internal.common_utils": ("torch._dynamo",)}
LEFTOVER_SECONDS = 10.0  # to kill and reap what a test process left; then the runner decides
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # prctl(2)
MAX_CRASHES = 50  # in one process; then the shard runner restarts the child (and collects)
exit_code: int | None = None  # set when the supervisor ran the tests (for shard_child's exit)
stderr_fd = 2  # the process's own stderr (shard_child saves it before pytest captures fd 2)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ci-relay crash restarts")
    group.addoption("--restart-crashes-in-process", action="store_true", default=False)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("restart_crashes_in_process") and config.getoption("progress_log"):
        config.pluginmanager.register(
            CrashRestarts(config.getoption("progress_log"), config.getoption("per_test_timeout")),
            "ci-relay-crash-restarts",
        )


class CrashRestarts:
    def __init__(self, progress: str, timeout: float | None) -> None:
        self.progress, self.timeout = os.path.abspath(progress), timeout or 0.0
        self.threads: int | None = None
        try:  # before collection: the supervisor's torch never starts an OpenMP pool
            import torch

            self.threads = torch.get_num_threads()
            torch.set_num_threads(1)
        except ImportError:
            pass

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        option = session.config.option
        if (
            not session.items
            or option.collectonly
            or (session.testsfailed and not option.continue_on_collection_errors)
        ):
            return None  # pytest's own loop says what happens then (nothing to fork for)
        global exit_code
        _import_ahead()
        # the collected state goes to the permanent generation: the test processes' garbage
        # collections never write its pages, so they stay shared with this process
        gc.freeze()
        own = _children() if _prctl(PR_SET_CHILD_SUBREAPER, 1) else None  # before any fork
        done: set[str] = set()
        crashes = 0
        while True:
            remaining = [item for item in session.items if item.nodeid not in done]
            if not remaining:
                exit_code = 1 if crashes else 0
                return True
            offset = os.lstat(self.progress).st_size
            stack_file = tempfile.TemporaryFile()  # noqa: SIM115 (the test process keeps it open)
            sys.stdout.flush()
            sys.stderr.flush()
            supervisor = os.getpid()
            pid = os.fork()
            if pid == 0:  # the test process: pytest's own loop over what is left
                _die_with(supervisor)
                faulthandler.enable(file=stack_file)  # a fatal signal's stack, for the record
                if self.threads:
                    import torch

                    torch.set_num_threads(self.threads)
                session.items[:] = remaining
                return None
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            clean = own is None or _end_leftovers(own)
            stack_file.seek(0)
            stack = stack_file.read().decode("utf-8", "replace")
            stack_file.close()
            if stack:  # where it would have gone without the supervisor: the child's stderr
                os.write(stderr_fd, stack.encode())
            reader = ProgressReader(self.progress, offset)  # a chunk at a time
            for events in reader.drain():
                done.update(str(e["nodeid"]) for e in events if e["event"] == "result")
            running, text = reader.running, reader.since_start
            if running is None:  # the test process ended on its own (or between two tests)
                if code == 0 or remaining[-1].nodeid in done:
                    exit_code = 1 if crashes and code in (0, 4) else code
                    return True
                os._exit(code if code > 0 else 128 - code)  # the runner decides what follows
            crashes += 1
            if crashes > MAX_CRASHES or not clean:  # (or what the test left would not end)
                os._exit(code if code > 0 else 128 - code)  # the runner records and restarts
            reason = why_it_died(code, self.timeout, text)
            self._write(
                {
                    "event": "result",
                    "nodeid": running,
                    "outcome": "crashed",
                    "mode": None,
                    "duration": 0.0,
                    "message": reason,
                    "details": crash_details(reason, text, stack),
                }
            )
            self._write({"event": "end", "nodeid": running})
            done.add(running)

    def _write(self, event: dict[str, Any]) -> None:
        # never through a symlink the test code may have put in the log's place
        fd = os.open(self.progress, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        try:
            os.write(fd, (json.dumps(event) + "\n").encode())
        finally:
            os.close(fd)


def _import_ahead() -> None:
    """Import now what each test process would import on its first test (its own time)."""
    for user, modules in FIRST_TEST_IMPORTS.items():
        if user not in sys.modules:
            continue
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # the tests meet it again and record it
                os.write(
                    stderr_fd, f"crash restarts: could not import {name} ahead: {exc}\n".encode()
                )


def _die_with(parent: int) -> None:
    """A test process never outlives its supervisor (nothing would record its results)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return bool(ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value, 0, 0, 0) == 0)


def _children() -> set[int]:
    """This process's children, zombies included (from /proc: the kernel's per-task
    ``children`` file is not built into every kernel)."""
    me, found = os.getpid(), set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[-1].split()  # after the command's name
        except OSError:
            continue  # ended meanwhile
        if len(fields) > 1 and fields[1] == str(me).encode():
            found.add(int(entry.name))
    return found


def _end_leftovers(own: set[int]) -> bool:
    """Kill and reap every process the ended test process left (they came here: this process
    is their subreaper), until none is left; False if some outlived LEFTOVER_SECONDS."""
    deadline = time.monotonic() + LEFTOVER_SECONDS
    ended = 0
    while left := _children() - own:
        if time.monotonic() > deadline:
            os.write(
                stderr_fd,
                f"crash restarts: {len(left)} leftover process(es) would not end\n".encode(),
            )
            return False
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    ended += 1
        time.sleep(0.01)
    if ended:
        os.write(stderr_fd, f"crash restarts: ended {ended} process(es) the tests left\n".encode())
    return True
