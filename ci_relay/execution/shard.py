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

Results are handed on as the child logs them (``on_results``, every TAIL_SECONDS and at each
process's end), and the runner keeps none of them: only their ids, counts, the crashed tests
and the must-pass failures a rerun may turn flaky, so a 25k-variant shard costs the worker a
set of ids, not every failure text. A caller that wants them all in memory collects them
(without ``on_results`` the report does).

The runtime kills a child whose scratch folder goes over its quota: the running
test is recorded as crashed, the test-writable part of scratch is wiped (the
runner's own files stay) and the next test runs. The runner never follows what
the child may have left in scratch (a symlink where its own file goes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ci_relay.execution.crashes import ProgressReader, crash_details, why_it_died
from ci_relay.execution.runtimes import Completed, Invocation, Limits, Runtime
from ci_relay.execution.spec_run import TestOutcome
from reuse_specs.backends import Backend, UnknownBackend, get_backend

# + specs/ and backend/: what a wipe of scratch keeps
RUNNER_FILES = ("tests-", "deselect-", "progress-", "coverage-")
RERUN_AT_MOST = 20
TAIL_SECONDS = 1.0  # how often a running child's new results are handed on
MUST_PASS = (None, "mandatory_success")  # the modes whose failures are rerun for flakes

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
    # each test process appends its tests' executed functions to scratch/coverage-N.jsonl
    # (the per-test coverage map, test_selection.coverage.map.read_streams)
    record_coverage: bool = False

    @property
    def restarts_in_process(self) -> bool:
        if self.restart_in_process is not None:
            return self.restart_in_process
        try:  # the declaration's fork_safe: a card's runtime may be unverified after fork()
            return get_backend(self.backend).fork_safe
        except UnknownBackend:
            return True  # the child refuses the name itself


@dataclass
class ShardReport:
    """How a shard ended. ``results`` holds every outcome only when the caller streamed
    none (``run_shard`` without ``on_results``); otherwise they went to ``on_results``."""

    results: dict[str, TestOutcome] = field(default_factory=dict)
    processes: int = 0
    log: list[str] = field(default_factory=list)
    error: str | None = None
    counts: Counter[str] = field(default_factory=Counter)  # stored outcome -> results
    crashed: list[str] = field(default_factory=list)
    coverage_streams: list[Path] = field(default_factory=list)  # in scratch: read before it goes


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


def _stored(outcome: TestOutcome) -> str:
    return "flaky" if outcome.flaky else outcome.outcome


class ResultsHandedOn:
    """What the runner keeps of the results it hands on: each test's stored outcome (not its
    text), and (up to ``keep_failures``) the must-pass failures a rerun may turn flaky. A later
    result for a test replaces the earlier one, as it does where they are stored (a crash
    recorded after the test logged its result, a rerun's flaky verdict). A batch
    ``on_results`` fails to take is retried with the next one, and :meth:`flush` raises if it
    still cannot be stored: a result is stored or the shard fails, never silently lost."""

    def __init__(self, on_results: OnResults, keep_failures: int) -> None:
        self.on_results, self.keep_failures = on_results, keep_failures
        self.done: dict[str, str] = {}  # nodeid -> stored outcome
        self.failed: set[str] = set()  # must-pass tests whose latest result is a failure
        self.failures: dict[str, TestOutcome] = {}  # their results, the first few only
        self.pending: list[TestOutcome] = []
        self.lock = threading.Lock()

    @property
    def must_pass_failures(self) -> int:
        return len(self.failed)

    def add(self, found: list[TestOutcome]) -> None:
        with self.lock:
            for outcome in found:
                nodeid = outcome.nodeid
                self.done[nodeid] = _stored(outcome)
                if outcome.outcome == "failed" and outcome.mode in MUST_PASS:
                    self.failed.add(nodeid)
                    if len(self.failures) <= self.keep_failures:
                        self.failures[nodeid] = outcome
                else:  # a first result, or one that replaces a failure
                    self.failed.discard(nodeid)
                    self.failures.pop(nodeid, None)
            batch, self.pending = self.pending + found, []
            if not batch:
                return
            try:
                self.on_results(batch)
            except Exception:
                log.exception("storing %d result(s) failed; retried with the next", len(batch))
                self.pending = batch

    def flush(self) -> None:
        with self.lock:
            if self.pending:
                self.on_results(self.pending)  # raises: the shard's results are not stored
                self.pending = []

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.done.values())

    @property
    def crashed(self) -> list[str]:
        return [nodeid for nodeid, outcome in self.done.items() if outcome == "crashed"]


class _Tail:
    """Hands a running child's new events to ``on_events`` every TAIL_SECONDS (time to first
    result is one test, not one shard), then, once it has ended, the rest of its log."""

    def __init__(
        self, reader: ProgressReader, on_events: Callable[[list[dict[str, object]]], None]
    ) -> None:
        self.reader, self.on_events = reader, on_events
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="progress-tail", daemon=True)

    def __enter__(self) -> _Tail:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        self.thread.join()
        for events in self.reader.drain():
            self.on_events(events)

    def _loop(self) -> None:
        while not self.stopping.wait(TAIL_SECONDS):
            self.on_events(self.reader.read())


def _write(path: Path, data: bytes) -> None:
    """A fresh file of the runner's: whatever is at ``path`` (a symlink the child planted,
    say) is removed, never written through."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    path.chmod(0o644)  # readable by the child's user whatever the worker's umask


def free_scratch(scratch: Path) -> None:
    """After a child went over its disk quota: everything it could write goes (its work
    folder, with HOME and TMPDIR), the runner's own files (tests-*, deselect-*,
    progress-*, specs/, backend/) stay. rmtree never follows a symlink out of scratch."""
    for entry in list(scratch.iterdir()) if scratch.is_dir() else []:
        own = entry.name.startswith(RUNNER_FILES) or entry.name in ("specs", "backend")
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
    coverage: Path | None = None,
    backends_dir: Path | None = None,
) -> list[str]:
    argv = [python, "-m", "ci_relay.execution.shard_child", "--upstream", str(request.upstream)]
    for spec in specs:
        argv += ["--spec", str(spec)]
    if backends_dir is not None:
        argv += ["--backends-dir", str(backends_dir)]
    argv += ["--backend", request.backend, "--tests", str(tests), "--deselect", str(deselect)]
    argv += ["--progress", str(progress), "--per-test-timeout", str(request.per_test_timeout)]
    if request.label:
        argv += ["--label", request.label]
    if request.restarts_in_process:
        argv += ["--restart-in-process"]
    if coverage is not None:
        argv += ["--coverage-stream", str(coverage)]
    return argv


def _copy_declaration(name: str, folder: Path) -> Path | None:
    """A declared backend that does not ship with ci-relay goes to the runtime as the specs
    do (the runtime sees only upstream and scratch): its declaration and the files it names,
    at the same places relative to each other. None for a bundled (or unknown) backend."""
    try:
        backend: Backend = get_backend(name)
    except UnknownBackend:
        return None
    if backend.bundled or backend.declaration is None:
        return None
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.unlink()
    folder.mkdir(exist_ok=True)
    folder.chmod(0o755)
    home = backend.declaration.parent
    for path in (backend.declaration, *backend.files):
        copy = folder / path.relative_to(home)
        for parent in reversed(copy.relative_to(folder).parents[:-1]):
            (folder / parent).mkdir(mode=0o755, exist_ok=True)
        _write(copy, path.read_bytes())
    return folder


def _attempt(
    runtime: Runtime,
    request: ShardRequest,
    tests: list[str],
    skip: set[str],
    n: int,
    on_events: Callable[[list[dict[str, object]]], None],
    on_coverage: Callable[[Path], None] = lambda _path: None,
) -> tuple[Completed, ProgressReader]:
    """One child process over ``tests`` minus ``skip``; its events go to ``on_events`` as
    it logs them. Returns how it ended and its log's reader (where it stopped, its last
    test's text)."""
    scratch = request.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    tests_file, deselect_file = scratch / f"tests-{n}.txt", scratch / f"deselect-{n}.txt"
    progress = scratch / f"progress-{n}.jsonl"
    coverage = scratch / f"coverage-{n}.jsonl" if request.record_coverage else None
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
    backends_dir = _copy_declaration(request.backend, scratch / "backend")
    invocation = Invocation(
        _command(
            runtime.python,
            specs,
            request,
            tests_file,
            deselect_file,
            progress,
            coverage,
            backends_dir,
        ),
        request.upstream,
        scratch,
        request.env,
        request.limits,
        outputs=(progress,) if coverage is None else (progress, coverage),
    )
    reader = ProgressReader(progress)
    with _Tail(reader, on_events):
        done = runtime.run(invocation)
    if done.killed_for:
        free_scratch(scratch)  # over quota: the next process starts with its space back
    if coverage is not None:
        on_coverage(coverage)
    return done, reader


def run_shard(
    runtime: Runtime,
    request: ShardRequest,
    max_processes: int = 50,
    on_results: OnResults | None = None,
) -> ShardReport:
    """Run the shard to the end. ``on_results`` (if given) gets every result as it comes,
    in batches, from another thread, and a rerun's flaky verdict as a second result for the
    same test (which replaces the first); without it, ``report.results`` holds them all."""
    report = ShardReport()
    if on_results is None:
        kept = report.results
        on_results = lambda found: kept.update((r.nodeid, r) for r in found)  # noqa: E731
    results = ResultsHandedOn(on_results, request.rerun_at_most)

    def on_events(events: list[dict[str, object]]) -> None:
        results.add([_outcome_of(e) for e in events if e["event"] == "result"])

    while report.processes < max_processes:
        report.processes += 1
        done, reader = _attempt(
            runtime,
            request,
            request.tests,
            set(results.done),
            report.processes,
            on_events,
            report.coverage_streams.append,
        )
        report.log.append(done.output[-4000:])
        running = reader.running
        if running is None and done.killed_for:
            if reader.events:
                continue  # killed between two tests: the rest go on in a new process
            report.error = f"the shard's process {done.killed_for} before it ran a test"
            break
        if running is None:
            if done.returncode not in (0, 1, 4) and not reader.events:
                report.error = f"the shard could not start tests (exit {done.returncode})"
            elif not results.done and request.tests:  # fail closed: nothing ran is no pass
                last = done.output.strip().splitlines()[-1:] or ["no output"]
                report.error = (
                    f"the shard ran none of its {len(request.tests)} test(s) "
                    f"(exit {done.returncode}): {last[0][:300]}"
                )
            break  # the child finished on its own
        text = reader.since_start
        reason = why_it_died(
            done.returncode, request.per_test_timeout, text, done.killed_for, done.timed_out
        )
        details = crash_details(reason, text, done.output)
        results.add([TestOutcome(running, "crashed", None, 0.0, reason, details=details)])
    if request.rerun_failures:
        _rerun_failures(runtime, request, report, results)
    results.flush()
    report.counts, report.crashed = results.counts, results.crashed
    return report


def _rerun_failures(
    runtime: Runtime, request: ShardRequest, report: ShardReport, results: ResultsHandedOn
) -> None:
    if not results.must_pass_failures:
        return
    if results.must_pass_failures > request.rerun_at_most:
        report.log.append(
            f"{results.must_pass_failures} must-pass failures, more than "
            f"{request.rerun_at_most}: not rerun to look for flakes"
        )
        return
    failed = results.failures

    def on_events(events: list[dict[str, object]]) -> None:
        for event in events:
            nodeid = str(event["nodeid"])
            if event["event"] == "result" and nodeid in failed and event["outcome"] == "passed":
                was = failed.pop(nodeid)
                flaky = dataclasses.replace(
                    was,
                    outcome="passed",
                    flaky=True,
                    message=f"flaky: failed, then passed on rerun ({was.message})",
                )
                results.add([flaky])

    report.processes += 1
    everything_else = set(results.done) - set(failed)
    _attempt(runtime, request, request.tests, everything_else, report.processes, on_events)
