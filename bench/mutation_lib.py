"""Mutation machinery for ``bench/bench_mutation.py`` (issue 35): which functions to break,
how to break one (``bench/mutation_operators.py``: a small edit of its source, made with
``ast`` positions so the rest of the file is untouched; its operators are listed there),
running a repository's tests with the break applied in the test process
(``bench/mutation_plugin.py`` swaps the function's code object, so every alias, wrapper and
registration table that holds the function sees it), and the same break as a git commit for
the selector.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mutation_operators import OPERATORS as OPERATORS  # re-exported for the bench
from mutation_operators import function_source, mutate_text
from mutation_operators import functions as functions  # re-exported for the bench

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SPEC_ENV = "MUTATION_PLUGIN_SPEC"
FAILED = ("failed", "crashed")


@dataclass(frozen=True)
class Target:
    """A function of the code under test: where the repository has it and how it imports."""

    file: str  # the repository's path of the file (the commit edits it)
    qualname: str  # ``name`` or ``Class.name``
    module: str  # the import name the tests reach it by

    @property
    def key(self) -> str:
        return f"{self.file}::{self.qualname}"


@dataclass
class Mutant:
    target: Target
    operator: str
    description: str
    runtime_source: str  # the mutated function (a def, dedented) the plugin compiles
    runtime_file: str  # the file the tests import it from
    commit_text: str  # the repository file with the same operator applied
    ident: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["target"] = asdict(self.target)
        out.pop("commit_text")
        return out


def make_mutant(
    target: Target,
    runtime_file: Path,
    commit_text: str,
    operator: str,
    seed: int,
) -> Mutant:
    """The mutant of ``target`` by ``operator``: on the source the tests import (compiled by
    the plugin) and on the repository's file (the commit); their edits are chosen with the
    same seed, so where both are the same text they are the same edit."""
    runtime_text = runtime_file.read_text()
    mutated, what = mutate_text(runtime_text, target.qualname, operator, random.Random(seed))
    source, _line = function_source(mutated, target.qualname)
    if commit_text == runtime_text:
        committed = mutated
    else:
        committed, _ = mutate_text(commit_text, target.qualname, operator, random.Random(seed))
    ident = f"{target.key}:{operator}:{seed}"
    return Mutant(target, operator, what, source, str(runtime_file), committed, ident)


def choose_targets(
    candidates: list[Target], count: int, seed: int, exclude: set[str] | None = None
) -> list[Target]:
    """``count`` targets drawn with ``seed`` (sorted first, so the draw depends on the seed
    and the candidates alone)."""
    pool = sorted((t for t in candidates if t.key not in (exclude or set())), key=lambda t: t.key)
    rng = random.Random(seed)
    return rng.sample(pool, min(count, len(pool)))


# --- running tests ------------------------------------------------------------------------


@dataclass
class RunResult:
    """What one pytest run recorded: ``outcomes`` per node id (``passed``, ``failed``,
    ``skipped``, ``crashed``), the generic test id of each node, and how the run ended."""

    outcomes: dict[str, str] = field(default_factory=dict)
    generic: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    timed_out: bool = False
    restarts: int = 0
    error: str | None = None
    applied: int = 0
    # files that failed to collect (a mutant run at import): their tests did not run
    collect_errors: set[str] = field(default_factory=set)
    # the return operator's helper: calls that changed the value, calls that could not
    perturbed: dict[str, Any] = field(default_factory=dict)

    def passed(self) -> set[str]:
        return {n for n, o in self.outcomes.items() if o == "passed"}


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill
    return out


class Runner:
    """Runs pytest for the bench (installed plugins not loaded unless ``autoload``): with
    ``preload`` (modules such as torch's testing helpers),
    through ``mutation_forkserver.py``, which imports them once and forks a child per run;
    else a new process per run. ``close()`` stops the server."""

    def __init__(
        self,
        python: str,
        pythonpath: list[str] | None = None,
        preload: list[str] | None = None,
        autoload: bool = False,
    ) -> None:
        self.python = python
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([*(pythonpath or []), str(HERE), str(ROOT)]),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.env.pop("PYTEST_ADDOPTS", None)
        self.env.pop(SPEC_ENV, None)
        if not autoload:  # installed pytest plugins cost seconds per run; -p names what is needed
            self.env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        self.preload = list(preload or [])
        self.server: subprocess.Popen[str] | None = None

    def _server(self) -> subprocess.Popen[str]:
        if self.server is None or self.server.poll() is not None:
            self.server = subprocess.Popen(
                [self.python, "-P", str(HERE / "mutation_forkserver.py"), *self.preload],
                env=self.env,
                cwd=tempfile.gettempdir(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            assert self.server.stdout is not None
            ready = self.server.stdout.readline()
            if not ready:
                raise RuntimeError(f"the fork server did not start ({self.python})")
        return self.server

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            assert self.server.stdin is not None
            self.server.stdin.close()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()
        self.server = None

    def once(
        self,
        args: list[str],
        cwd: Path,
        spec: Path,
        log: Path,
        out: Path,
        limits: tuple[float, float],
    ) -> tuple[int, str | None]:
        """One pytest run; its exit code (negative: killed by that signal) and why it was
        stopped: ``hang`` (no test ended for ``limits[1]`` seconds), ``timeout`` (the run
        took ``limits[0]`` seconds) or None."""
        total, per_test = limits
        began = time.monotonic()
        if not self.preload:
            with out.open("wb") as sink:
                proc = subprocess.Popen(
                    [self.python, "-P", "-m", "pytest", *args],
                    cwd=cwd,
                    env={**self.env, SPEC_ENV: str(spec)},
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                pid = proc.pid

                def done() -> int | None:
                    return proc.poll()

                stopped = self._watch(pid, done, log, began, total, per_test)
                return proc.wait(), stopped
        server = self._server()
        assert server.stdin is not None and server.stdout is not None
        request = {"args": args, "cwd": str(cwd), "env": {SPEC_ENV: str(spec)}, "out": str(out)}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        pid = json.loads(server.stdout.readline())["pid"]
        reader = server.stdout

        def ended() -> int | None:
            ready, _, _ = select.select([reader], [], [], 0)
            return 0 if ready else None

        stopped = self._watch(pid, ended, log, began, total, per_test)
        line = reader.readline()
        if not line:
            raise RuntimeError("the fork server died")
        return int(json.loads(line)["status"]), stopped

    @staticmethod
    def _watch(
        pid: int,
        done: Any,
        log: Path,
        began: float,
        total: float,
        per_test: float,
    ) -> str | None:
        """Wait for the run; kill its process group when it hangs or runs out of time."""
        seen, last = -1, time.monotonic()
        while done() is None:
            now = time.monotonic()
            size = log.stat().st_size if log.exists() else 0
            if size != seen:
                seen, last = size, now
            why = "timeout" if now - began > total else "hang" if now - last > per_test else None
            if why:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                while done() is None:
                    time.sleep(0.05)
                return why
            time.sleep(0.2)
        return None

    def run(
        self,
        cwd: Path,
        root: Path,
        pytest_args: list[str],
        timeout: float,
        mutant: Mutant | None = None,
        restarts: int = 3,
        test_timeout: float = 120.0,
        only: set[str] | None = None,
    ) -> RunResult:
        """Run pytest with the mutation plugin (and ``mutant`` applied, if any), at most
        ``timeout`` seconds in all. A run whose process dies, or whose test runs past
        ``test_timeout``, records the test it was in as ``crashed`` and goes on without the
        tests already recorded (at most ``restarts`` times), as the relay's runner does; a run
        past ``timeout`` in all is cut there (the test it was in is not counted) and marked
        ``timed_out``. ``only`` (generic ids) runs just those tests of the files. A file that
        fails to collect is recorded in ``collect_errors`` (pytest's exit 2 is then no
        error of the run: with a mutant, its tests count as failing)."""
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        result = RunResult()
        began = time.monotonic()
        own = own_deselection(root)
        with tempfile.TemporaryDirectory(prefix="mutation-run-") as scratch:
            spec_path = Path(scratch) / "spec.json"
            log = Path(scratch) / "outcomes.jsonl"
            output = Path(scratch) / "output.txt"
            skip: list[str] = []
            for attempt in range(restarts + 1):
                left = timeout - (time.monotonic() - began)
                if left <= 1:
                    result.timed_out = True
                    break
                spec = {
                    "mutant": mutant.to_json() if mutant else None,
                    "log": str(log),
                    "root": str(root),
                    "skip": skip,
                    "only": sorted(only) if only is not None else None,
                }
                spec_path.write_text(json.dumps(spec))
                log.unlink(missing_ok=True)
                args = [
                    "-q", "-p", "no:cacheprovider", "-p", "mutation_plugin", "--no-header",
                    "-o", f"addopts={own}", "--continue-on-collection-errors", *pytest_args,
                ]  # fmt: skip
                code, stopped = self.once(args, cwd, spec_path, log, output, (left, test_timeout))
                current: str | None = None
                for record in _read_lines(log):
                    if "error" in record:
                        result.error = record["error"]
                    elif "collect_error" in record:
                        result.collect_errors.add(record["collect_error"])
                    elif "applied" in record:
                        result.applied = record["applied"]
                    elif "perturbed" in record:
                        got = record["perturbed"]
                        for k in ("changed", "unchanged"):
                            result.perturbed[k] = result.perturbed.get(k, 0) + got[k]
                        kinds = set(result.perturbed.get("types", [])) | set(got["types"])
                        result.perturbed["types"] = sorted(kinds)
                    elif "start" in record:
                        current = record["start"]
                        result.generic[current] = record["test"]
                    elif "outcome" in record:
                        result.outcomes[record["nodeid"]] = record["outcome"]
                        current = None
                if result.error:
                    break
                if stopped == "timeout":
                    result.timed_out = True
                    break
                died = stopped == "hang" or code < 0 or (current is not None and code != 0)
                if not died:
                    if code not in (0, 1, 5) and not (code == 2 and result.collect_errors):
                        text = output.read_text(errors="replace") if output.is_file() else ""
                        tail = text.strip().splitlines()[-5:]
                        result.error = f"pytest exit {code}: " + " | ".join(tail)
                    break
                if current is not None:
                    result.outcomes[current] = "crashed"
                if attempt == restarts:
                    break
                result.restarts += 1
                skip = sorted(result.outcomes)
        result.seconds = time.monotonic() - began
        return result


def failing_tests(baseline: RunResult, mutated: RunResult) -> set[str]:
    """Generic ids (``FILE::Class::test``) of the tests with a variant that passed unmutated
    and failed, errored or crashed with the mutant, or whose file the mutant kept from
    collecting: the truth."""
    out = set()
    for nodeid in baseline.passed():
        now = mutated.outcomes.get(nodeid)
        if now in FAILED or (now is None and nodeid.split("::", 1)[0] in mutated.collect_errors):
            out.add(mutated.generic.get(nodeid) or baseline.generic.get(nodeid, nodeid))
    return out


# --- the same mutation as a commit ----------------------------------------------------------


def _git(
    repo: Path, *args: str, env: dict[str, str] | None = None, data: bytes | None = None
) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], input=data, capture_output=True, check=True, env=env
    )
    return proc.stdout.decode().strip()


def commit_mutant(repo: Path, base: str, mutant: Mutant) -> str:
    """A commit on ``base`` whose only change is the mutant's file (git objects and a ref
    under ``refs/mutation/``: the checkout and its index are untouched)."""
    blob = _git(repo, "hash-object", "-w", "--stdin", data=mutant.commit_text.encode())
    with tempfile.TemporaryDirectory(prefix="mutation-index-") as scratch:
        env = {
            **os.environ,
            "GIT_INDEX_FILE": str(Path(scratch) / "index"),
            "GIT_AUTHOR_NAME": "mutation",
            "GIT_AUTHOR_EMAIL": "mutation@example.invalid",
            "GIT_COMMITTER_NAME": "mutation",
            "GIT_COMMITTER_EMAIL": "mutation@example.invalid",
            "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
        }
        _git(repo, "read-tree", base, env=env)
        mode = _git(repo, "ls-tree", base, "--", mutant.target.file).split()[0]
        _git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{mutant.target.file}", env=env)
        tree = _git(repo, "write-tree", env=env)
        message = f"{mutant.operator} in {mutant.target.qualname}\n\n{mutant.description}\n"
        head = _git(repo, "commit-tree", tree, "-p", base, env=env, data=message.encode())
    name = "".join(c if c.isalnum() else "-" for c in mutant.ident)[:180]
    _git(repo, "update-ref", f"refs/mutation/{name}", head)
    return head


def own_deselection(folder: Path) -> str:
    """The repository's own choice of tests from its ``addopts`` (``-m "not stress"``,
    ``--ignore``, ``--deselect``, ``-k``), kept where the rest of its addopts (coverage,
    xdist, output) is dropped: without it a repository that deselects its stress tests
    there runs them all."""
    from test_selection.layout import pytest_options, selecting_addopts

    def read(name: str) -> str | None:
        path = folder / name
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None

    kept = []
    for word in selecting_addopts(pytest_options(read)):
        name, eq, value = word.partition("=")
        # pytest reads these paths from where it is started (a scratch folder here)
        kept.append(f"{name}={folder / value}" if eq and name.startswith("--") else word)
    return shlex.join(kept)
