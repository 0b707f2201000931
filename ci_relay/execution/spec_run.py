"""Run (or only collect) upstream tests under reuse specs in an in-process pytest session.

The same plugin does the work in CI and locally; this module only builds the
pytest command line, shows progress and turns reports into typed results.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ci_relay.execution.outcomes import (
    BAD_OUTCOMES,
    classify,
    collection_failure,
    failure_details,
    is_final,
    short_message,
)
from reuse_specs.backends import Backend
from reuse_specs.loader import LoadedSpec
from reuse_specs.matching import Decision, TestVariant
from reuse_specs.pytest_plugin import NOTE_PROPERTY, PLUGIN_NAME, ReuseSpecSession

EXIT_OK = 0
EXIT_TESTS_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INFRASTRUCTURE = 3
EXIT_NOTHING_SELECTED = 4


@dataclass
class TestOutcome:
    """One test variant's result, with the mode the spec gave it (and whether a rerun passed).

    ``message`` is the one line a list shows; ``details`` the whole failure text (pytest's
    longrepr, or a crash's reason and stack) that a developer reads to find out why.
    """

    __test__ = False

    nodeid: str
    outcome: str
    mode: str | None
    duration: float
    message: str = ""
    flaky: bool = False
    details: str = ""
    note: str = ""  # what the result does not say by itself (e.g. it ran on the CPU)


@dataclass
class RunResult:
    outcomes: list[TestOutcome] = field(default_factory=list)
    collection_errors: list[str] = field(default_factory=list)
    pytest_exit: int = 0
    junit: Path | None = None

    @property
    def counts(self) -> Counter[str]:
        return Counter(o.outcome for o in self.outcomes)

    @property
    def problems(self) -> list[TestOutcome]:
        return [o for o in self.outcomes if o.outcome in BAD_OUTCOMES]

    @property
    def exit_code(self) -> int:
        if self.pytest_exit in (
            pytest.ExitCode.INTERNAL_ERROR,
            pytest.ExitCode.USAGE_ERROR,
            pytest.ExitCode.INTERRUPTED,
        ):
            return EXIT_INFRASTRUCTURE
        if not self.outcomes:
            return EXIT_NOTHING_SELECTED
        return EXIT_TESTS_FAILED if self.problems else EXIT_OK


class _ResultCollector:
    """pytest plugin object that records outcomes and feeds a progress callback."""

    def __init__(
        self,
        result: RunResult,
        on_total: Callable[[int], None],
        on_outcome: Callable[[TestOutcome], None],
    ) -> None:
        self.result = result
        self.on_total = on_total
        self.on_outcome = on_outcome
        self.decided: list[tuple[str, TestVariant, Decision]] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # that file's result; the other files still run
            self.result.collection_errors.append(f"{report.nodeid}: {report.longreprtext}")
            nodeid, message, details = collection_failure(report)
            outcome = TestOutcome(nodeid, "error", None, 0.0, message, details=details)
            self.result.outcomes.append(outcome)
            self.on_outcome(outcome)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        spec_session = session.config.pluginmanager.get_plugin(PLUGIN_NAME)
        if isinstance(spec_session, ReuseSpecSession):
            self.decided = spec_session.decided
        self.on_total(len(session.items))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        final = is_final(report)
        if not final:
            return
        props = dict(report.user_properties)
        mode = props.get("reuse_spec.mode")
        outcome = TestOutcome(
            nodeid=report.nodeid,
            outcome=classify(report),
            mode=str(mode) if mode is not None else None,
            duration=report.duration,
            message="" if report.passed else short_message(report),
            details=failure_details(report),
            note=str(props.get(NOTE_PROPERTY) or ""),
        )
        self.result.outcomes.append(outcome)
        self.on_outcome(outcome)


@contextmanager
def _ini_for(upstream: Path) -> Iterator[Path]:
    """The upstream's own pytest.ini when it has one, else an empty one (never ours)."""
    own = upstream / "pytest.ini"
    if own.is_file():
        yield own
        return
    with tempfile.TemporaryDirectory(prefix="ci-relay-ini-") as tmp:
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n", encoding="utf-8")
        yield ini


def pytest_args(
    spec_paths: list[Path],
    spec: LoadedSpec,
    upstream: Path,
    backend: Backend,
    ini: Path,
    junit: Path | None = None,
    label: str | None = None,
    collect_only: bool = False,
    tests_file: Path | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The pytest command line ``ci-relay run`` uses; usable as-is for a local rerun."""
    files = spec.test_files()
    if tests_file is not None:
        wanted = {
            line.split("::", 1)[0].strip()
            for line in tests_file.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")
        }
        files = [f for f in files if f.relative_to(upstream.resolve()).as_posix() in wanted]
    args = [str(p) for p in files]
    args += ["-p", "reuse_specs.pytest_plugin"]
    for path in spec_paths:
        args += ["--reuse-spec", str(path)]
    args += ["--reuse-backend", backend.name, "--reuse-upstream", str(upstream)]
    if label:
        args += ["--reuse-label", label]
    if tests_file is not None:
        args += ["--reuse-tests", str(tests_file)]
    # pytest's terminal reporter stays (run_pytest sends it to /dev/null): without it, a
    # failing rewritten ``assert a == b`` crashes inside pytest's diff and the failure text
    # is pytest's own AssertionError instead of the test's (pytest-dev/pytest#14377)
    args += ["-c", str(ini), "--rootdir", str(upstream), "-p", "no:cacheprovider"]
    args += ["-o", "junit_family=xunit2"]
    # a file that does not import (an upstream file newer or older than the installed torch)
    # is that file's error result; the other files still run
    args.append("--continue-on-collection-errors")
    if junit is not None:
        args += ["--junitxml", str(junit)]
    if collect_only:
        args.append("--collect-only")
    return args + (extra or [])


def run_pytest(
    args_for: Callable[[Path], list[str]],
    upstream: Path,
    on_total: Callable[[int], None] = lambda _n: None,
    on_outcome: Callable[[TestOutcome], None] = lambda _o: None,
) -> tuple[RunResult, list[tuple[str, TestVariant, Decision]]]:
    """Run pytest in this process without writing caches or bytecode into the upstream tree.

    pytest's own terminal output goes to /dev/null: results come through the collector,
    and the caller's progress display owns the terminal.
    """
    result = RunResult()
    collector = _ResultCollector(result, on_total, on_outcome)
    saved = sys.dont_write_bytecode
    # bytecode (pytest's rewritten modules too) is written only where it cannot land in the
    # upstream tree: under the cache folder PYTHONPYCACHEPREFIX names, if one is set
    sys.dont_write_bytecode = saved or not sys.pycache_prefix
    try:
        with (
            _ini_for(upstream) as ini,
            open(os.devnull, "w", encoding="utf-8") as quiet,
            redirect_stdout(quiet),
        ):
            result.pytest_exit = int(pytest.main(args_for(ini), plugins=[collector]))
    finally:
        sys.dont_write_bytecode = saved
    return result, collector.decided
