"""The tests a mutant of ``bench/bench_mutation.py`` runs (its scope: the files, or the tests,
the coverage map says reached the function) and the unmutated run they are judged against
(kept per file with ``--baseline``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import mutation_lib as ml
from mutation_options import Options

from test_selection.coverage.map import CoverageIndex


def within_path(path: str, prefix: str) -> bool:
    """Whether ``path`` is ``prefix`` (a file) or under it (a folder)."""
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def reached_tests(index: CoverageIndex | None, target: ml.Target) -> set[str]:
    """The generic ids of the tests the map says executed the function."""
    if index is None:
        return set()
    return set(index.reaches(index.resolve(target.file, target.qualname)))


def test_command(opts: Options, files: list[str]) -> list[str]:
    args = [str(opts.repo / f) for f in files]
    if opts.specs:
        args += ["-p", "reuse_specs.pytest_plugin", "--reuse-upstream", str(opts.repo)]
        args += ["--reuse-backend", opts.backend]
        for spec in opts.specs:
            args += ["--reuse-spec", str(spec)]
    return [*args, f"--rootdir={opts.repo}", *opts.pytest_args]


def mutant_scope(
    opts: Options, index: CoverageIndex, target: ml.Target
) -> tuple[list[str], set[str]]:
    """The test files a mutant of ``target`` runs and the tests the map says reached it."""
    tests = reached_tests(index, target)
    if opts.tests:
        tests = {t for t in tests if any(t.startswith(p) for p in opts.tests)}
    return sorted({t.split("::", 1)[0] for t in tests}), tests


def run_baseline(
    opts: Options,
    runner: ml.Runner,
    cwd: Path,
    base: str,
    scopes: list[tuple[list[str], set[str] | None]],
    log: Any,
) -> ml.RunResult:
    """The unmutated run of every file (and, ``--scope tests``, only the tests) in
    ``scopes``."""
    files = sorted({f for fs, _t in scopes for f in fs})
    wanted: set[str] | None = None
    if opts.scope == "tests" and scopes and all(t is not None for _f, t in scopes):
        wanted = set().union(*(t for _f, t in scopes if t is not None))
    baseline = unmutated(opts, runner, cwd, base, files, opts.count, wanted)
    log(
        f"baseline: {len(baseline.outcomes)} tests of {len(files)} files, "
        f"{len(baseline.passed())} passed, {baseline.seconds:.1f} s"
    )
    return baseline


def within(result: ml.RunResult, files: list[str], tests: set[str] | None) -> ml.RunResult:
    """The part of ``result`` (a baseline) in a mutant's scope: its files, and its tests."""
    out = ml.RunResult()
    everything = "." in files  # --scope all without --tests: every test of the checkout
    for nodeid, outcome in result.outcomes.items():
        generic = result.generic.get(nodeid, nodeid)
        file = nodeid.split("::", 1)[0]
        if not everything and not any(within_path(file, f) for f in files):  # a file or a folder
            continue
        if tests is not None and generic not in tests:
            continue
        out.outcomes[nodeid] = outcome
        out.generic[nodeid] = generic
    return out


def unmutated(
    opts: Options,
    runner: ml.Runner,
    cwd: Path,
    base: str,
    files: list[str],
    mutants: int,
    only: set[str] | None = None,
) -> ml.RunResult:
    """The outcomes of ``files`` unmutated (only the tests ``only`` names, if given); with
    ``opts.baseline``, kept there per file for the next run at the same revision and command
    (only the files it lacks run)."""
    tests = hashlib.sha256(json.dumps(sorted(only)).encode()).hexdigest() if only else None
    specs = [str(p) for p in opts.specs]
    key = json.dumps(
        [base, opts.python, specs, opts.backend, opts.installed, opts.pytest_args, tests],
        default=str,
    )
    kept: dict[str, Any] = {}
    if opts.baseline is not None and opts.baseline.is_file():
        data = json.loads(opts.baseline.read_text())
        kept = data.get("files", {}) if data.get("key") == key else {}
    result = ml.RunResult()
    missing = [f for f in files if f not in kept]
    if missing:
        fresh = runner.run(
            cwd,
            opts.repo,
            test_command(opts, missing),
            timeout=max(opts.timeout * mutants, 600.0),
            test_timeout=opts.test_timeout,
            only=only,
        )
        if fresh.error:
            raise SystemExit(f"the unmutated run failed: {fresh.error}")
        result.seconds = fresh.seconds
        for f in missing:
            kept[f] = {"outcomes": {}, "generic": {}}
        for nodeid, outcome in fresh.outcomes.items():
            file = nodeid.split("::", 1)[0]
            if file in kept:
                kept[file]["outcomes"][nodeid] = outcome
                kept[file]["generic"][nodeid] = fresh.generic.get(nodeid, nodeid)
        if opts.baseline is not None and not fresh.timed_out:
            opts.baseline.write_text(json.dumps({"key": key, "files": kept}))
    for f in files:
        result.outcomes.update(kept[f]["outcomes"])
        result.generic.update(kept[f]["generic"])
    return result
