"""A pytest plugin that records, per test, the functions of the code under test it executed.

On Python 3.12+ through ``sys.monitoring`` (``first_calls.py``: each function's and line's
first run per test, then silence; every thread). Before 3.12, or asked for with
``--coverage-profiler cprofile``, through ``cProfile`` (the standard library's C profiler,
enabled around each test): it sees every Python function call at a fraction of a line
tracer's cost, and its caller/callee pairs give each function's distance from the test in
calls (``bench/bench_coverage_record.py`` measures the ways against plain pytest).

Files are named as the upstream repository names them: below the upstream root, relative to
it; below an installed copy of one of the upstream's top-level packages (an installed
``torch`` for pytorch/pytorch), ``PACKAGE/...``. Everything else (the standard library, other
packages, pytest) is left out.

A test that starts threads or processes, or replaces the profiler, is recorded as far as the
profiler saw and flagged; the plugin never fails a test.

``--coverage-lines`` also records the lines each test executed in the upstream's code files:
through ``sys.monitoring`` on 3.12+, else through coverage.py (its C tracer, one dynamic
context per test) when the recording Python has it installed; without it the map says why it
holds no lines. Lines are kept for a whole map
(``--record-coverage``) only: a shard's stream stays at function level.

Enable with ``-p test_selection.coverage_recorder --record-coverage FILE --coverage-root DIR``
(one map, written when the session ends), or ``--coverage-stream FILE`` (a relay shard: each
upstream test's record is appended when the next test starts, or every second through a long
run of its variants, so a test process that crashes, or one forked per crash by the shard's
restarts, loses at most the last second of the test it crashed in; ``coverage_map.read_streams``
turns the lines into a map).
"""

from __future__ import annotations

import ast
import contextlib
import cProfile
import inspect
import json
import os
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from test_selection.coverage import first_calls
from test_selection.coverage.first_calls import FirstCalls
from test_selection.coverage.map import (
    MAX_DEPTH,
    MAX_ERRORS,
    STREAM_FORMAT,
    CoverageMap,
    Function,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ci-relay coverage")
    group.addoption("--record-coverage", default=None, help="write a per-test coverage map here")
    group.addoption(
        "--coverage-stream", default=None, help="append each test's record to this file (JSONL)"
    )
    group.addoption(
        "--coverage-root", default=None, help="the upstream checkout (default: rootdir)"
    )
    group.addoption("--coverage-repository", default=None, help="owner/name recorded in the map")
    group.addoption("--coverage-revision", default="working-tree", help="the commit recorded")
    group.addoption("--coverage-backend", default=None, help="the backend recorded")
    group.addoption(
        "--coverage-lines",
        action="store_true",
        default=False,
        help="also record the lines each test executed (before Python 3.12 or with "
        "cProfile: needs coverage.py)",
    )
    group.addoption(
        "--coverage-profiler",
        choices=("auto", "monitoring", "cprofile"),
        default="auto",
        help="how calls are seen: sys.monitoring's first calls per test (Python 3.12+, the "
        "default where a tool id is free), or cProfile around each test",
    )
    group.addoption(
        "--coverage-progress",
        default=None,
        help="append 'done total' to this file about twice a second (a terminal's progress bar)",
    )
    group.addoption(
        "--coverage-package",
        action="append",
        default=[],
        help="a top-level package of the upstream whose installed copy counts as its code "
        "(default: the packages found at the root and under src/)",
    )


def upstream_packages(root: Path) -> list[str]:
    """Top-level packages of a checkout: folders with ``__init__.py`` at its root or in src/."""
    found = []
    for base in (root, root / "src"):
        if base.is_dir():
            found += [
                p.name
                for p in sorted(base.iterdir())
                if p.is_dir() and (p / "__init__.py").is_file() and p.name.isidentifier()
            ]
    return sorted(set(found) - {"test", "tests", "testing", "benchmarks", "docs"})


class Namer:
    """File path of a code object -> the path the upstream repository gives it (or None)."""

    def __init__(self, root: Path, packages: list[str]) -> None:
        self.root = str(root.resolve()) + os.sep
        self.installed: list[tuple[str, str]] = []  # (folder + sep, package name)
        for package in packages:
            spec = _find_spec(package)
            for location in spec or ():
                folder = str(Path(location).resolve()) + os.sep
                if not folder.startswith(self.root):
                    self.installed.append((folder, package))
        self.cache: dict[str, str | None] = {}

    def __call__(self, filename: str) -> str | None:
        try:
            return self.cache[filename]
        except KeyError:
            pass
        name = None
        if filename and not filename.startswith("<"):
            path = os.path.realpath(filename)
            if path.startswith(self.root):
                name = path[len(self.root) :].replace(os.sep, "/")
            else:
                for folder, package in self.installed:
                    if path.startswith(folder):
                        name = f"{package}/{path[len(folder) :].replace(os.sep, '/')}"
                        break
        self.cache[filename] = name
        return name


def _find_spec(package: str) -> list[str] | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations is None:
        return None
    return list(spec.submodule_search_locations)


def generic_test_id(item: pytest.Item, root: Path) -> str:
    """``FILE::Class::test`` of the test as written, before device or dtype instantiation
    (the innermost wrapped function's qualified name), relative to the upstream root."""
    try:
        file = Path(str(item.path)).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        file = item.nodeid.split("::", 1)[0]
    function = getattr(item, "obj", None)
    target = inspect.unwrap(function) if callable(function) else None
    qualname = getattr(target, "__qualname__", "") or ""
    if qualname and "<locals>" not in qualname and qualname.count(".") <= 1:
        return f"{file}::{qualname.replace('.', '::')}"
    parts = item.nodeid.split("[", 1)[0].split("::")
    return "::".join([file, *parts[1:]])


class StreamWriter:
    """Appends records to a JSON-lines file, one ``os.write`` per line (``O_APPEND``): a
    function is defined once per process (``{"pid", "f": [id, file, qualname]}``), a test's
    record names the ids (``{"pid", "t": test, "s": [[id, depth], ...], "flags"}``). A test
    already written in this process is written again only with what it adds (the variants
    of one upstream test mostly execute the same functions). A process forked from this one
    starts its own ids under its own pid."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.pid = -1
        self._reset()

    def _reset(self) -> None:
        self.pid = os.getpid()
        self.ids: dict[Function, int] = {}
        self.written: dict[str, dict[Function, int]] = {}
        self._line({"format": STREAM_FORMAT, "pid": self.pid})

    def _line(self, record: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def collection_error(self, text: str) -> None:
        """A file that failed to collect (``{"pid", "e": text}``): the map must say so."""
        if os.getpid() != self.pid:
            self._reset()
        self._line({"pid": self.pid, "e": text})

    def add(self, test: str, functions: dict[Function, int], flags: set[str]) -> None:
        if os.getpid() != self.pid:
            self._reset()
        known = self.written.setdefault(test, {})
        new = {f: d for f, d in functions.items() if d < known.get(f, MAX_DEPTH + 1)}
        if not new and not flags and known:
            return
        lines = []
        for function in new:
            if function not in self.ids:
                self.ids[function] = len(self.ids)
                lines.append({"pid": self.pid, "f": [self.ids[function], *function]})
        for record in lines:
            self._line(record)
        pairs = sorted([self.ids[f], d] for f, d in new.items())
        self._line({"pid": self.pid, "t": test, "s": pairs, "flags": sorted(flags)})
        known.update(new)


FLUSH_SECONDS = 1.0  # a shard's stream gets a long run of variants' record at least this often
PROGRESS_SECONDS = 0.5  # the progress file gets a line at most this often


class ProgressFile:
    """Tests run so far and collected, appended as ``done total`` lines for the command that
    started pytest (``ci-relay coverage record`` draws its bar from the last line): a write
    per half second, not per test, and a full disk costs the bar, never the recording."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.done = 0
        self.total = 0
        self.written = 0.0

    def write(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.written >= PROGRESS_SECONDS:
            self.written = now
            with contextlib.suppress(OSError):
                os.write(self.fd, f"{self.done} {self.total}\n".encode())


@dataclass
class _Pending:
    """The upstream test being profiled: its id, profiler, flags and first variant."""

    test: str
    profiler: cProfile.Profile | None  # None: the session's sys.monitoring records it
    flags: set[str]
    item: pytest.Item
    started: float = field(default_factory=time.monotonic)


class Recorder:
    def __init__(self, config: pytest.Config) -> None:
        opt = config.option
        self.output = Path(opt.record_coverage) if opt.record_coverage else None
        self.stream = StreamWriter(Path(opt.coverage_stream)) if opt.coverage_stream else None
        self.root = Path(opt.coverage_root or config.rootpath).resolve()
        packages = opt.coverage_package or upstream_packages(self.root)
        self.namer = Namer(self.root, packages)
        self.map = CoverageMap(
            repository=opt.coverage_repository or self.root.name,
            revision=opt.coverage_revision,
            backend=opt.coverage_backend,
        )
        self.current_flags: set[str] | None = None
        self.pending: _Pending | None = None  # the upstream test being profiled
        whole_map_lines = opt.coverage_lines and self.stream is None
        self.monitor = (
            FirstCalls(self.namer, lines=whole_map_lines)
            if _monitoring(opt.coverage_profiler)
            else None
        )
        self.lines: LineTracer | None = None
        self.test_files: set[str] = set()  # with the monitor's lines: left out at the end
        if whole_map_lines and self.monitor is None:
            try:
                self.lines = LineTracer(self._code_folders(packages), self.namer)
            except ImportError:
                self.map.lines_missing = "coverage.py is not installed in the recording Python"
            except Exception as exc:  # another tracer holds the interpreter: functions only
                self.map.lines_missing = f"coverage.py could not start ({exc})"[:300]
        self.started = time.monotonic()
        self.progress = ProgressFile(Path(opt.coverage_progress)) if opt.coverage_progress else None
        self.collection_errors: list[str] = []
        threading.setprofile(self._thread_started)
        sys.addaudithook(self._audit)

    def _code_folders(self, packages: list[str]) -> list[str]:
        """Where the upstream's code lives: its packages' folders in the checkout and
        installed, or the whole checkout when it has no package folder."""
        folders = [folder for folder, _package in self.namer.installed]
        for package in packages:
            for base in (self.root, self.root / "src"):
                if (base / package / "__init__.py").is_file():
                    folders.append(str(base / package))
        return folders or [str(self.root)]

    def _thread_started(self, frame: Any, event: str, arg: Any) -> None:
        if self.current_flags is not None:
            self.current_flags.add("threads")
        sys.setprofile(None)  # this thread is not followed: no more calls here

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.current_flags is not None and event in (
            "subprocess.Popen",
            "os.fork",
            "os.posix_spawn",
            "os.exec",
        ):
            self.current_flags.add("processes")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        """Profile the test. Consecutive variants of one upstream test (a parametrized test's
        cases, a device-generic test's dtypes) share one profiler and one record, read when
        the next upstream test starts: the map keeps their union anyway, and reading a
        profile once per variant cost milliseconds each (tens of thousands of variants)."""
        test = generic_test_id(item, self.root)
        pending = self.pending
        if pending is not None and pending.test != test:
            self._flush()
            pending = None
        fresh = pending is None
        if pending is None:
            profiler = None if self.monitor is not None else cProfile.Profile()
            pending = self.pending = _Pending(test, profiler, set(), item)
        self.current_flags = pending.flags
        if self.lines is not None:
            self.lines.switch(test, self.namer(str(item.path)))
        self._start(pending, fresh)
        try:
            yield
        finally:
            self._stop(pending)
            self.current_flags = None
            if self.progress is not None:
                self.progress.done += 1
                self.progress.write()
            # a shard's stream: what a crash would lose stays under a second of variants
            if self.stream is not None and time.monotonic() - pending.started > FLUSH_SECONDS:
                self._flush()

    def _start(self, pending: _Pending, fresh: bool) -> None:
        if self.monitor is not None:
            if fresh:
                test_file = self.namer(str(pending.item.path))
                if test_file:
                    self.test_files.add(test_file)
                self.monitor.start(test_file)
            return
        assert pending.profiler is not None
        try:
            pending.profiler.enable()
        except ValueError:  # another profiler holds the interpreter
            pending.flags.add("failed-to-record")

    def _stop(self, pending: _Pending) -> None:
        if self.monitor is not None:
            return  # on until the next test starts (FirstCalls.start)
        assert pending.profiler is not None
        # before 3.12 a profiler is the thread's profile function; from 3.12 on cProfile is a
        # sys.monitoring tool, and getprofile() no longer shows it
        replaced = sys.version_info < (3, 12) and sys.getprofile() is not cast(
            object, pending.profiler
        )
        pending.profiler.disable()
        if replaced:
            pending.flags.add("profiler-replaced")

    def _flush(self) -> None:
        """Write the pending test's record (its variants so far)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        try:
            if self.monitor is not None:
                functions = dict(self.monitor.read())
            else:
                assert pending.profiler is not None
                functions = self._functions(pending.profiler, pending.item)
        except Exception:  # never fail a test over its record
            functions = {}
            pending.flags.add("failed-to-record")
        if self.stream is not None:
            # a full disk: the map loses a test, the test runs on
            with contextlib.suppress(OSError):
                self.stream.add(pending.test, functions, pending.flags)
        else:
            lines = self.monitor.read_lines() if self.monitor is not None else None
            self.map.add(pending.test, functions, pending.flags, lines)

    def _functions(self, profiler: cProfile.Profile, item: pytest.Item) -> dict[Function, int]:
        """Named functions the test executed, each with its distance in calls from the test
        file's own code (the test, its class's set-up) or, unreached from it, the deepest."""
        entries = profiler.getstats()
        test_file = self.namer(str(item.path))  # named (and cached) like every other file
        callees: dict[object, list[object]] = {}
        roots: list[object] = []
        for entry in entries:
            callees[entry.code] = [sub.code for sub in (entry.calls or ())]
            if (
                isinstance(entry.code, types.CodeType)
                and test_file is not None
                and self.namer(entry.code.co_filename) == test_file
            ):
                roots.append(entry.code)
        depth: dict[object, int] = dict.fromkeys(roots, 0)
        queue = deque(roots)
        while queue:
            caller = queue.popleft()
            for callee in callees.get(caller, ()):
                if callee not in depth:
                    depth[callee] = depth[caller] + 1
                    queue.append(callee)
        out: dict[Function, int] = {}
        for key in callees:
            if not isinstance(key, types.CodeType):
                continue
            code: types.CodeType = key
            name = self.namer(code.co_filename)
            if name is None or code.co_name == "<module>":
                continue
            reached = depth.get(code)
            function = (name, code.co_qualname)
            value = MAX_DEPTH if reached is None else max(1, reached)
            if value < out.get(function, MAX_DEPTH + 1):
                out[function] = value
        return out

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """Remember what failed to collect (a map of half the tests must say so)."""
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            lines = [x for x in str(report.longrepr or "").strip().splitlines() if x.strip()]
            marked = [x[1:].strip() for x in lines if x.startswith("E ")]  # pytest's error mark
            last = (
                str(crash.message).strip().splitlines()[0]
                if crash is not None and str(crash.message).strip()
                else (marked[-1] if marked else (lines[-1].strip() if lines else "error"))
            )
            self.collection_errors.append(f"{report.nodeid or '.'}: {last[:300]}")
            if self.stream is not None:
                with contextlib.suppress(OSError):
                    self.stream.collection_error(self.collection_errors[-1])

    def _drop_test_files(self) -> None:
        """Lines of test files and conftest.py are not kept (as the line tracer leaves them
        out): the selector asks about changed code, never about test files."""
        for test, files in self.map.lines.items():
            self.map.lines[test] = {
                name: numbers
                for name, numbers in files.items()
                if name not in self.test_files and not name.endswith("conftest.py")
            }

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.progress is not None:
            self.progress.total = len(session.items)
            self.progress.write(force=True)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.progress is not None:
            self.progress.write(force=True)
        self._flush()
        if self.monitor is not None:
            self.monitor.close()
            self._drop_test_files()
        threading.setprofile(None)
        self.map.seconds = time.monotonic() - self.started
        self.map.collected = session.testscollected
        self.map.collection_errors = self.collection_errors[:MAX_ERRORS]
        if self.lines is not None:
            spans = FunctionSpans()
            for test, lines in self.lines.finish().items():
                if test in self.map.tests:
                    unseen = self.map.flags.get(test, set()) & UNFOLLOWED
                    found = spans.functions(lines, self.lines.paths) if unseen else {}
                    self.map.add(test, found, (), lines)
        if self.output is not None:
            self.map.save(self.output)


class LineTracer:
    """The lines each test executed in the upstream's code, through coverage.py: one
    in-memory measurement for the session, one dynamic context per test (its id), read back
    per file at the end. A test's own file and ``conftest.py`` files are left out (the
    selector asks about changed code, never about test files)."""

    def __init__(self, folders: list[str], namer: Namer) -> None:
        import coverage  # ImportError: the caller records functions only

        self.namer = namer
        self.current = ""
        self.test_files: set[str] = set()
        self.paths: dict[str, str] = {}  # a recorded file's name -> where it was measured
        self.coverage = coverage.Coverage(
            data_file=None, source=folders, config_file=False, branch=False
        )
        self.coverage.start()

    def switch(self, test: str, test_file: str | None) -> None:
        """Count what runs from now on for ``test`` (consecutive variants of one upstream
        test stay in one context: a switch costs a write of the context's lines)."""
        if test_file:
            self.test_files.add(test_file)
        if test != self.current:
            self.current = test
            self.coverage.switch_context(test)

    def finish(self) -> dict[str, dict[str, set[int]]]:
        """test -> file -> lines; the measurement stops."""
        self.coverage.stop()
        data = self.coverage.get_data()
        out: dict[str, dict[str, set[int]]] = {}
        for path in data.measured_files():
            name = self.namer(path)
            if name is None or name in self.test_files or name.endswith("conftest.py"):
                continue
            self.paths[name] = path
            for line, tests in data.contexts_by_lineno(path).items():
                for test in tests:
                    if test:
                        out.setdefault(test, {}).setdefault(name, set()).add(line)
        return out


def _monitoring(choice: str) -> bool:
    """Whether this session records with ``sys.monitoring`` (``--coverage-profiler``)."""
    if choice == "cprofile":
        return False
    if not first_calls.available():
        if choice == "monitoring":
            raise pytest.UsageError("--coverage-profiler monitoring: needs Python 3.12+ "
                                    "with a free sys.monitoring tool id")  # fmt: skip
        return False
    return True


# flags of a test whose calls the profiler did not all see: code run in a thread it started
# (a web framework's test client runs the app in one) or after it replaced the profiler
UNFOLLOWED = frozenset({"threads", "profiler-replaced"})


class FunctionSpans:
    """The function each line of a file belongs to, read from its source once: a test the
    profiler could not follow everywhere (``UNFOLLOWED``) gets, from the lines coverage.py
    traced in every thread, the functions they are in, at the farthest distance (how far
    from the test is not known). Named as the profiler names them: ``Class.method``,
    ``outer.<locals>.inner``; a line of a def's header or decorators belongs to the code
    around it (it runs when the def is made), comprehensions and lambdas to their def."""

    def __init__(self) -> None:
        self.owners: dict[str, dict[int, str]] = {}

    def functions(self, lines: dict[str, set[int]], paths: dict[str, str]) -> dict[Function, int]:
        found: dict[Function, int] = {}
        for name, numbers in lines.items():
            owner = self._owners(name, paths.get(name))
            for number in numbers:
                qualname = owner.get(number)
                if qualname is not None:
                    found[(name, qualname)] = MAX_DEPTH
        return found

    def _owners(self, name: str, path: str | None) -> dict[int, str]:
        if name not in self.owners:
            self.owners[name] = {}
            try:
                tree = ast.parse(Path(path).read_bytes()) if path else None
            except (OSError, SyntaxError, ValueError):
                tree = None
            if tree is not None:
                self._walk(tree.body, "", self.owners[name])
        return self.owners[name]

    def _walk(self, nodes: Iterable[ast.AST], prefix: str, owner: dict[int, str]) -> None:
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                self._walk(node.body, f"{prefix}{node.name}.", owner)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                qualname = f"{prefix}{node.name}"
                first = node.body[0].lineno
                for number in range(first, (node.end_lineno or first) + 1):
                    owner[number] = qualname  # inner defs, walked next, take their own
                self._walk(node.body, f"{qualname}.<locals>.", owner)
            elif isinstance(node, ast.stmt | ast.excepthandler):  # if / try / with bodies
                self._walk(ast.iter_child_nodes(node), prefix, owner)


def pytest_configure(config: pytest.Config) -> None:
    if config.option.record_coverage or config.option.coverage_stream:
        config.pluginmanager.register(Recorder(config), "ci-relay-coverage-recorder")
