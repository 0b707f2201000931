"""Run one shard so that every test gets a result, whatever any single test does.

The shard's tests run in a child process (:mod:`ci_relay.execution.shard_child`) inside a
runtime, logging each start and result as it happens. When the child dies (segfault, memory limit,
per-test timeout, shard timeout), the test that was running is recorded as
crashed, with the reason and the stack ``faulthandler`` printed as it died, and
the tests not yet run go on in a new test process: forked by the child from its already
collected state (:mod:`.crash_restarts`), or, for a backend not known to be fork-safe or when
the child itself died, a new child started by the runner, as PyTorch's ``run_test`` does.
Failures of must-pass tests are rerun once: a pass then marks the test flaky rather than
broken.

The runtime kills a child whose scratch folder goes over its quota: the running
test is recorded as crashed, the test-writable part of scratch is wiped (the
runner's own files stay) and the next test runs. The runner never follows what
the child may have left in scratch (a symlink where its own file goes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ci_relay.execution.crashes import crash_details, read_events, why_it_died
from ci_relay.execution.runtimes import Completed, Invocation, Limits, Runtime
from ci_relay.execution.spec_run import TestOutcome

MAX_PROGRESS_BYTES = 256 * 1024 * 1024  # of a progress log read back (its end, if longer)
RUNNER_FILES = ("tests-", "deselect-", "progress-")  # + specs/: what a wipe of scratch keeps
RERUN_AT_MOST = 20
TAIL_SECONDS = 1.0  # how often a running child's new results are handed on
TAIL_READ_BYTES = 8 * 1024 * 1024  # at most this much new progress log per look
FORK_UNSAFE_BACKENDS = frozenset({"spyre"})  # a card's runtime, unverified after fork()

OnResults = Callable[[list[TestOutcome]], None]
log = logging.getLogger("ci_relay.execution")


@dataclass
class ShardRequest:
    tests: list[str]  # generic ids: FILE::Class::test
    specs: list[Path]
    upstream: Path
    scratch: Path
    backend: str = "cpu"
    per_test_timeout: float = 600.0
    limits: Limits = field(default_factory=Limits)
    env: dict[str, str] = field(default_factory=dict)
    rerun_failures: bool = True
    # more must-pass failures than this are not flakes: no rerun (it would cost a whole
    # second collection of the shard's files and every failing test again)
    rerun_at_most: int = RERUN_AT_MOST
    label: str | None = None  # only spec entries with this label run (the others: skipped)
    # after a crash, the child forks its next test process from its collected state instead
    # of the runner starting (and collecting) a new child: None = the backend's default,
    # off for a real card whose runtime is not known to be fork-safe
    restart_in_process: bool | None = None

    @property
    def restarts_in_process(self) -> bool:
        if self.restart_in_process is not None:
            return self.restart_in_process
        return self.backend not in FORK_UNSAFE_BACKENDS


@dataclass
class ShardReport:
    results: dict[str, TestOutcome] = field(default_factory=dict)
    processes: int = 0
    log: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def crashed(self) -> list[str]:
        return [r.nodeid for r in self.results.values() if r.outcome == "crashed"]


def _outcome_of(event: dict[str, object]) -> TestOutcome:
    mode = event.get("mode")
    return TestOutcome(
        str(event["nodeid"]),
        str(event["outcome"]),
        mode if isinstance(mode, str) else None,
        _seconds(event.get("duration")),
        str(event.get("message") or ""),
        details=str(event.get("details") or ""),
        note=str(event.get("note") or "")[:500],
    )


def _seconds(value: object) -> float:
    try:
        return max(0.0, float(value or 0.0))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def _open_log(path: Path) -> int | None:
    """A read descriptor on the child's progress log if it is a regular file (never a
    FIFO or a symlink the child put in its place)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


class ProgressTail:
    """Hands on the results a running child has logged so far, every TAIL_SECONDS, so a
    caller can store them before the shard ends (time to first result is one test, not
    one shard). The shard's final report stays the record: this is only early news."""

    def __init__(self, path: Path, on_results: OnResults) -> None:
        self.path, self.on_results = path, on_results
        self.offset, self.partial = 0, b""
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="progress-tail", daemon=True)

    def __enter__(self) -> ProgressTail:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        self.thread.join()

    def _loop(self) -> None:
        while not self.stopping.wait(TAIL_SECONDS):
            self.poll()

    def poll(self) -> None:
        fd = _open_log(self.path)
        if fd is None:
            return
        try:
            os.lseek(fd, self.offset, os.SEEK_SET)
            chunk = os.read(fd, TAIL_READ_BYTES)
        finally:
            os.close(fd)
        if not chunk:
            return
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        if len(self.partial) > TAIL_READ_BYTES:  # one endless line: not a result
            self.partial = b""
        events = read_events(b"\n".join(lines).decode(errors="replace"))
        found = [_outcome_of(e) for e in events if e.get("event") == "result"]
        if found:
            _hand_on(self.on_results, found)


def _hand_on(on_results: OnResults, found: list[TestOutcome]) -> None:
    try:
        on_results(found)
    except Exception:  # early news only: the final report still stores everything
        log.exception("storing %d streamed result(s) failed", len(found))


def _write(path: Path, data: bytes) -> None:
    """A fresh file of the runner's: whatever is at ``path`` (a symlink the child planted,
    say) is removed, never written through."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    path.chmod(0o644)  # readable by the child's user whatever the worker's umask


def _read_progress(path: Path) -> str:
    """The progress log the child wrote: a regular file only (not a FIFO or a symlink it
    put there instead), at most its last MAX_PROGRESS_BYTES."""
    fd = _open_log(path)
    if fd is None:
        return ""
    with os.fdopen(fd, "rb") as progress:
        size = os.fstat(progress.fileno()).st_size
        if size > MAX_PROGRESS_BYTES:
            progress.seek(size - MAX_PROGRESS_BYTES)
        return progress.read(MAX_PROGRESS_BYTES).decode(errors="replace")


def free_scratch(scratch: Path) -> None:
    """After a child went over its disk quota: everything it could write goes (its work
    folder, with HOME and TMPDIR), the runner's own files (tests-*, deselect-*,
    progress-*, specs/) stay. rmtree never follows a symlink out of scratch."""
    for entry in list(scratch.iterdir()) if scratch.is_dir() else []:
        own = entry.name.startswith(RUNNER_FILES) or entry.name == "specs"
        if own and not entry.is_symlink():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, onerror=_unlock)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()


def _unlock(func: object, path: str, _exc: object) -> None:
    """rmtree's error hook: a folder the child made unwritable to its owner (a worker that
    is not root); allow it, and try again once."""
    parent = os.path.dirname(path)
    with contextlib.suppress(OSError):
        os.chmod(parent, 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


def _command(
    python: str,
    specs: list[Path],
    request: ShardRequest,
    tests: Path,
    deselect: Path,
    progress: Path,
) -> list[str]:
    argv = [python, "-m", "ci_relay.execution.shard_child", "--upstream", str(request.upstream)]
    for spec in specs:
        argv += ["--spec", str(spec)]
    argv += ["--backend", request.backend, "--tests", str(tests), "--deselect", str(deselect)]
    argv += ["--progress", str(progress), "--per-test-timeout", str(request.per_test_timeout)]
    if request.label:
        argv += ["--label", request.label]
    if request.restarts_in_process:
        argv += ["--restart-in-process"]
    return argv


def _attempt(
    runtime: Runtime,
    request: ShardRequest,
    tests: list[str],
    skip: set[str],
    n: int,
    on_results: OnResults | None = None,
) -> tuple[Completed, list[dict[str, object]], str]:
    scratch = request.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    tests_file, deselect_file = scratch / f"tests-{n}.txt", scratch / f"deselect-{n}.txt"
    progress = scratch / f"progress-{n}.jsonl"
    _write(tests_file, ("\n".join(tests) + "\n").encode())
    _write(deselect_file, ("\n".join(sorted(skip)) + "\n").encode())
    specs_dir = scratch / "specs"  # copies: the runtime sees only upstream and scratch
    if specs_dir.is_symlink() or (specs_dir.exists() and not specs_dir.is_dir()):
        specs_dir.unlink()
    specs_dir.mkdir(exist_ok=True)
    specs_dir.chmod(0o755)
    specs = []
    for i, spec in enumerate(request.specs):
        copy = specs_dir / f"{i}-{spec.name}"
        _write(copy, spec.read_bytes())
        specs.append(copy)
    invocation = Invocation(
        _command(runtime.python, specs, request, tests_file, deselect_file, progress),
        request.upstream,
        scratch,
        request.env,
        request.limits,
        outputs=(progress,),
    )
    with ProgressTail(progress, on_results) if on_results else contextlib.nullcontext():
        done = runtime.run(invocation)
    text = _read_progress(progress)
    if done.killed_for:
        free_scratch(scratch)  # over quota: the next process starts with its space back
    return done, read_events(text), text


def run_shard(
    runtime: Runtime,
    request: ShardRequest,
    max_processes: int = 50,
    on_results: OnResults | None = None,
) -> ShardReport:
    """Run the shard to the end; ``on_results`` (if given) gets results while it runs, in
    batches, from another thread. Only the returned report is final (a rerun can turn a
    failure into a flake)."""
    report = ShardReport()
    skip: set[str] = set()
    while report.processes < max_processes:
        report.processes += 1
        done, events, text = _attempt(
            runtime, request, request.tests, skip, report.processes, on_results
        )
        report.log.append(done.output[-4000:])
        running: str | None = None
        for event in events:
            nodeid = str(event["nodeid"])
            if event["event"] == "start":
                running = nodeid
            elif event["event"] == "result":
                report.results[nodeid] = _outcome_of(event)
                skip.add(nodeid)
            elif event["event"] == "end":
                running = None
        if running is None and done.killed_for:
            if events:
                continue  # killed between two tests: the rest go on in a new process
            report.error = f"the shard's process {done.killed_for} before it ran a test"
            break
        if running is None:
            if done.returncode not in (0, 1, 4) and not events:
                report.error = f"the shard could not start tests (exit {done.returncode})"
            elif not report.results and request.tests:  # fail closed: nothing ran is no pass
                last = done.output.strip().splitlines()[-1:] or ["no output"]
                report.error = (
                    f"the shard ran none of its {len(request.tests)} test(s) "
                    f"(exit {done.returncode}): {last[0][:300]}"
                )
            break  # the child finished on its own
        reason = why_it_died(
            done.returncode, request.per_test_timeout, text, done.killed_for, done.timed_out
        )
        crash = TestOutcome(
            running, "crashed", None, 0.0, reason, details=crash_details(reason, text, done.output)
        )
        report.results[running] = crash
        skip.add(running)
        if on_results is not None:
            _hand_on(on_results, [crash])
    if request.rerun_failures:
        _rerun_failures(runtime, request, report)
    return report


def _rerun_failures(runtime: Runtime, request: ShardRequest, report: ShardReport) -> None:
    failed = [
        r
        for r in report.results.values()
        if r.outcome == "failed" and r.mode in (None, "mandatory_success")
    ]
    if not failed:
        return
    if len(failed) > request.rerun_at_most:
        report.log.append(
            f"{len(failed)} must-pass failures, more than {request.rerun_at_most}: "
            "not rerun to look for flakes"
        )
        return
    keep = {r.nodeid for r in failed}
    everything_else = set(report.results) - keep
    report.processes += 1
    _done, events, _text = _attempt(
        runtime, request, request.tests, everything_else, report.processes
    )
    for event in events:
        if event["event"] == "result" and event["nodeid"] in keep and event["outcome"] == "passed":
            record = report.results[str(event["nodeid"])]
            record.outcome, record.flaky = "passed", True
            record.message = f"flaky: failed, then passed on rerun ({record.message})"
