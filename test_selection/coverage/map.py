"""A per-test coverage map: which functions of the code under test each test executed.

Recorded where the tests really run (a relay shard, or ``ci-relay coverage record`` on any
Python repository) and read by the selector: a changed function leads to the tests that
executed it, the more specific first. Function level, named as the upstream repository names
them (``torch/_refs/__init__.py`` and ``add``, ``nn/modules/linear.py`` and ``Linear.forward``),
so a map recorded on an installed package matches a diff of the repository.

The file is gzip-compressed JSON. Tests that executed the same functions share one entry (the
variants of one upstream test mostly do), and each function of a test carries the number of
calls between the test and it (1: the test called it), which is what "specific" means below.

A map may also hold, per test, the lines it executed in the upstream's own code files
(``lines``, recorded through coverage.py when the recording Python has it): a change to a few
statements of a long function then leads first to the tests that ran those statements.
Stored as line ranges per file (``"3-9,14"``), equal sets shared as the functions' are.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

FORMAT = "ci-relay-coverage/1"
STREAM_FORMAT = "ci-relay-coverage-stream/1"  # what a shard appends as its tests end
MAX_STREAM_LINE = 16 * 1024 * 1024  # a test of 200k functions is ~3 MB of ids
MAX_DEPTH = 15  # calls from the test; deeper ones are stored as this
REVISION = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64}|working-tree)$")
# what a test did that the recorder could not follow: still recorded, with this flag
FLAGS = frozenset({"threads", "processes", "profiler-replaced", "failed-to-record"})
MAX_ERRORS = 20  # collection errors kept in a map

Function = tuple[str, str]  # (file as the repository names it, qualified name)
Lines = dict[str, frozenset[int]]  # file as the repository names it -> lines executed


class CoverageMapError(ValueError):
    """A map that cannot be used: unknown format, another repository, a bad field."""


@dataclass
class CoverageMap:
    repository: str
    revision: str
    backend: str | None = None
    recorded_at: str = field(
        default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds")
    )
    # test id (FILE::Class::test) -> {function: calls from the test}
    tests: dict[str, dict[Function, int]] = field(default_factory=dict)
    flags: dict[str, set[str]] = field(default_factory=dict)
    seconds: float = 0.0  # time spent recording (tests included)
    # what pytest collected where the map was recorded (None: not known, e.g. a relay
    # shard's streams) and the first collection errors, "node id: last line"
    collected: int | None = None
    collection_errors: list[str] = field(default_factory=list)
    # brought forward from an older map (coverage_update.py): tests kept from that revision
    reused: int = 0
    reused_from: str = ""
    # test id -> the lines it executed per code file, for the tests recorded at line level
    lines: dict[str, Lines] = field(default_factory=dict)
    # why lines were not recorded where they were asked for ("" when they were, or not asked)
    lines_missing: str = ""

    def add(
        self,
        test: str,
        functions: Mapping[Function, int],
        flags: Iterable[str] = (),
        lines: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        """Merge one test's functions (a test recorded twice, e.g. per variant, keeps the union
        and each function's shortest distance) and, when recorded, its lines (the union)."""
        if lines is not None:
            known_lines = self.lines.setdefault(test, {})
            for file, numbers in lines.items():
                known_lines[file] = known_lines.get(file, frozenset()) | frozenset(numbers)
        known = self.tests.setdefault(test, {})
        for function, depth in functions.items():
            depth = min(max(1, depth), MAX_DEPTH)
            if depth < known.get(function, MAX_DEPTH + 1):
                known[function] = depth
        marks = set(flags) & FLAGS
        if marks:
            self.flags.setdefault(test, set()).update(marks)

    def merge(self, other: CoverageMap) -> None:
        """Another shard's map of the same repository and revision."""
        if (other.repository, other.revision) != (self.repository, self.revision):
            raise CoverageMapError(
                f"cannot merge a map of {other.repository}@{other.revision[:12]} into one of "
                f"{self.repository}@{self.revision[:12]}"
            )
        for test, functions in other.tests.items():
            self.add(test, functions, other.flags.get(test, ()), other.lines.get(test))
        self.seconds += other.seconds

    def functions(self) -> set[Function]:
        return {f for functions in self.tests.values() for f in functions}

    def index(self) -> CoverageIndex:
        return CoverageIndex(self)

    # --- the file ---

    def to_json(self) -> dict[str, Any]:
        table: dict[Function, int] = {}
        sets: dict[tuple[tuple[int, int], ...], int] = {}
        entries: list[list[list[int]]] = []
        tests: dict[str, int] = {}
        for test in sorted(self.tests):
            pairs = tuple(
                sorted((table.setdefault(f, len(table)), d) for f, d in self.tests[test].items())
            )
            if pairs not in sets:
                sets[pairs] = len(entries)
                entries.append([list(p) for p in pairs])
            tests[test] = sets[pairs]
        return {
            "format": FORMAT,
            "repository": self.repository,
            "revision": self.revision,
            "backend": self.backend,
            "recorded_at": self.recorded_at,
            "seconds": round(self.seconds, 3),
            "functions": [list(f) for f in table],
            "sets": entries,
            "tests": tests,
            "flags": {t: sorted(v) for t, v in sorted(self.flags.items())},
            "collected": self.collected,
            "collection_errors": self.collection_errors[:MAX_ERRORS],
            "reused": self.reused,
            "reused_from": self.reused_from,
            **({"lines": _lines_to_json(self.lines)} if self.lines else {}),
            **({"lines_missing": self.lines_missing} if self.lines_missing else {}),
        }

    @classmethod
    def from_json(cls, data: Any, *, source: str = "the map") -> CoverageMap:
        if not isinstance(data, dict):
            raise CoverageMapError(f"{source}: not a coverage map (a JSON object was expected)")
        if data.get("format") != FORMAT:
            raise CoverageMapError(
                f"{source}: format {data.get('format')!r} is not one this version reads "
                f"(expected {FORMAT!r})"
            )
        try:
            functions = [(str(f), str(q)) for f, q in data["functions"]]
            sets = [[(int(i), int(d)) for i, d in entry] for entry in data["sets"]]
            result = cls(
                repository=str(data["repository"]),
                revision=str(data["revision"]),
                backend=data.get("backend"),
                recorded_at=str(data.get("recorded_at", "")),
                seconds=float(data.get("seconds", 0.0)),
            )
            for test, number in data["tests"].items():
                result.tests[str(test)] = {functions[i]: d for i, d in sets[int(number)]}
            for test, marks in data.get("flags", {}).items():
                result.flags[str(test)] = set(map(str, marks)) & FLAGS
            collected = data.get("collected")
            result.collected = None if collected is None else int(collected)
            result.collection_errors = [str(e) for e in data.get("collection_errors") or ()][
                :MAX_ERRORS
            ]
            result.reused = int(data.get("reused") or 0)
            result.reused_from = str(data.get("reused_from") or "")
            if data.get("lines") is not None:
                result.lines = _lines_from_json(data["lines"])
            result.lines_missing = str(data.get("lines_missing") or "")
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CoverageMapError(f"{source}: a damaged coverage map ({exc!r})") from None
        if not REVISION.match(result.revision):
            raise CoverageMapError(f"{source}: revision {result.revision!r} is not a commit id")
        return result

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as out:
            json.dump(self.to_json(), out, separators=(",", ":"))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> CoverageMap:
        try:
            with gzip.open(path, "rt", encoding="utf-8") as stream:
                data = json.load(stream)
        except FileNotFoundError:
            raise CoverageMapError(f"{path}: no such coverage map") from None
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CoverageMapError(f"{path}: not a readable coverage map ({exc})") from None
        return cls.from_json(data, source=str(path))


def ranges(numbers: Iterable[int]) -> str:
    """``1,2,3,7,9,10`` -> ``"1-3,7,9-10"``; numbers below 1 are no line of a file and are
    left out (``parse_ranges`` refuses them: a map is never written that cannot be read)."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted({n for n in numbers if n > 0}):
        if run and n == run[-1] + 1:
            run[-1] = n
        else:
            if run:
                out.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
            run = [n, n]
    if run:
        out.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
    return ",".join(out)


def parse_ranges(text: str) -> frozenset[int]:
    """The inverse of ``ranges``; a malformed part raises ValueError."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        start, end = int(first), int(last or first)
        if not 0 < start <= end or end - start > 1_000_000:
            raise ValueError(f"bad line range {part!r}")
        out.update(range(start, end + 1))
    return frozenset(out)


def _lines_to_json(lines: Mapping[str, Lines]) -> dict[str, Any]:
    files: dict[str, int] = {}
    sets: dict[tuple[tuple[int, str], ...], int] = {}
    tests: dict[str, int] = {}
    for test in sorted(lines):
        entry = tuple(
            sorted((files.setdefault(f, len(files)), ranges(n)) for f, n in lines[test].items())
        )
        tests[test] = sets.setdefault(entry, len(sets))
    return {
        "files": list(files),
        "sets": [[list(pair) for pair in entry] for entry in sets],
        "tests": tests,
    }


def _lines_from_json(data: Mapping[str, Any]) -> dict[str, Lines]:
    files = [str(f) for f in data["files"]]
    sets = [{files[int(i)]: parse_ranges(str(r)) for i, r in entry} for entry in data["sets"]]
    return {str(test): sets[int(number)] for test, number in data["tests"].items()}


def refusal(cmap: CoverageMap, error: str | None = None) -> str | None:
    """Why a map must not be used, or None: it recorded no test, or the run that recorded
    it ended in a collection error (the tests of the files that failed would look newer
    than the map). ``error``: how the run that recorded it ended, when it failed."""
    if cmap.collection_errors:
        more = len(cmap.collection_errors) - 1
        return f"pytest could not collect the tests: {cmap.collection_errors[0]}" + (
            f" (and {more} more)" if more > 0 else ""
        )
    if error:
        return f"the run that recorded it failed: {error}"
    if not cmap.tests:
        if cmap.collected == 0:
            return "pytest collected no test"
        return "it recorded no test"
    return None


@dataclass(frozen=True)
class Reach:
    """How a test reached a changed function: which one, in how many calls, and how much
    of the code it executes in all (fewer: more specific)."""

    function: Function
    depth: int
    executed: int
    functions: int = 1  # how many of the changed functions the test executed

    @property
    def specificity(self) -> float:
        """In (0, 1]: 1 for a test that called the function directly and little else."""
        return 1.0 / (self.depth * (1.0 + math.log10(max(1, self.executed))))


class CoverageIndex:
    """The map turned around: function -> the tests that executed it."""

    def __init__(self, cmap: CoverageMap) -> None:
        self.map = cmap
        self.by_function: dict[Function, list[tuple[str, int]]] = {}
        self.by_name: dict[tuple[str, str], list[Function]] = {}  # (file, last name part)
        self.size = {test: len(functions) for test, functions in cmap.tests.items()}
        for test, functions in cmap.tests.items():
            for function, depth in functions.items():
                self.by_function.setdefault(function, []).append((test, depth))
        for function in self.by_function:
            short = function[1].rsplit(".", 1)[-1]
            self.by_name.setdefault((function[0], short), []).append(function)

    def known(self, function: Function) -> bool:
        return function in self.by_function

    def lines_of(self, test: str, file: str) -> frozenset[int] | None:
        """The lines of ``file`` the test executed, or None when the map does not know them
        (recorded at function level, or kept from an older map whose file has changed)."""
        recorded = self.map.lines.get(test)
        if recorded is None:
            return None
        return recorded.get(file, frozenset())

    def resolve(self, file: str, qualname: str) -> list[Function]:
        """The map's functions for a changed def: the same qualified name, or a method or
        class of it (a changed class covers its methods), else the same short name in the
        file (a def moved into or out of a class, a renamed enclosing class)."""
        exact = (file, qualname)
        found = [exact] if exact in self.by_function else []
        prefix = qualname + "."
        found += [f for f in self.by_function if f[0] == file and f[1].startswith(prefix)]
        if not found:
            found = list(self.by_name.get((file, qualname.rsplit(".", 1)[-1]), []))
        return found

    def reaches(self, functions: Iterable[Function]) -> dict[str, Reach]:
        """Each test that executed any of ``functions``, with its most specific reach and
        how many of them it executed."""
        best: dict[str, Reach] = {}
        count: dict[str, int] = {}
        for function in dict.fromkeys(functions):  # once each, in order (ties: the first)
            for test, depth in self.by_function.get(function, ()):
                count[test] = count.get(test, 0) + 1
                reach = Reach(function, depth, self.size[test])
                if test not in best or reach.specificity > best[test].specificity:
                    best[test] = reach
        return {test: replace(reach, functions=count[test]) for test, reach in best.items()}


def read_streams(
    paths: Iterable[Path], repository: str, revision: str, backend: str | None = None
) -> tuple[CoverageMap, int]:
    """A map from the JSON-lines records a shard's processes appended (the recorder's
    ``--coverage-stream``), and how many lines could not be used: the last line of a process
    killed mid-write, or anything a test process wrote over the file (it is the child's).
    Functions are numbered per process: each record names its pid."""
    cmap = CoverageMap(repository=repository, revision=revision, backend=backend)
    skipped = 0
    for path in paths:
        names: dict[tuple[int, int], Function] = {}
        try:
            stream = path.open("rb")
        except OSError:
            continue
        with stream:
            for raw in _lines(stream):
                if raw is None:  # longer than any record the recorder writes
                    skipped += 1
                    continue
                try:
                    record = json.loads(raw)
                    pid = int(record["pid"])
                    if "f" in record:
                        number, file, qualname = record["f"]
                        names[(pid, int(number))] = (str(file), str(qualname))
                    elif "t" in record:
                        functions = {names[(pid, int(i))]: int(d) for i, d in record["s"]}
                        cmap.add(str(record["t"]), functions, map(str, record.get("flags", ())))
                    elif "e" in record:
                        if len(cmap.collection_errors) < MAX_ERRORS:
                            cmap.collection_errors.append(str(record["e"])[:400])
                    elif record.get("format") != STREAM_FORMAT:
                        skipped += 1
                except (ValueError, KeyError, TypeError):
                    skipped += 1
    return cmap, skipped


def _lines(stream: IO[bytes]) -> Iterator[bytes | None]:
    """The file's lines, or None for one longer than MAX_STREAM_LINE (never held whole: the
    file is written by the tests' process, which may write anything)."""
    while True:
        line = stream.readline(MAX_STREAM_LINE)
        if not line:
            return
        if len(line) == MAX_STREAM_LINE and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = stream.readline(MAX_STREAM_LINE)
            yield None
            continue
        yield line
