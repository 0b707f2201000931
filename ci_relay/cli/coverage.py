"""``ci-relay coverage record`` and ``coverage show``: per-test coverage maps of any Python
repository's own tests, for ``select --coverage``.

``record`` checks the revision out as a detached git worktree (never the person's working
tree), runs the repository's tests there with plain pytest and the recording plugin
(``test_selection.coverage_recorder``), and writes the map. Like ``run`` without
``--runtime``, it runs the repository's tests on this machine, in the caller's own session:
a person's command, not the relay's (the relay records inside its isolated shards).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ci_relay.cli.common import _fail, err, out
from ci_relay.cli.follow import follow_pytest

coverage_app = typer.Typer(help="Per-test coverage maps for selection.", no_args_is_help=True)

# pytest's exit codes that mean the run did not test what it was asked to (0 and 1 did)
PYTEST_EXITS = {
    2: "pytest was interrupted",
    3: "pytest hit an internal error",
    4: "pytest refused its arguments",
    5: "pytest collected no test",
}
REMOTE = re.compile(r"[:/]([\w.-]+/[\w.-]+?)(?:\.git)?/?$")


def repository_name(upstream: Path) -> str:
    """``owner/name`` from the checkout's origin remote, else the folder's name."""
    proc = subprocess.run(
        ["git", "-C", str(upstream), "remote", "get-url", "origin"],
        capture_output=True,
        text=True,
        check=False,
    )
    match = REMOTE.search(proc.stdout.strip()) if proc.returncode == 0 else None
    return match.group(1) if match else upstream.resolve().name


@coverage_app.command(
    "record", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def record(
    ctx: typer.Context,
    upstream: Annotated[Path, typer.Option(help="The repository (a git checkout).")],
    rev: Annotated[str, typer.Option(help="The revision to record at.")] = "HEAD",
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Map file (default coverage-REV.json.gz)."),
    ] = None,
    repository: Annotated[
        str | None, typer.Option(help="owner/name stored in the map (default: origin's).")
    ] = None,
    backend: Annotated[str | None, typer.Option(help="Backend name stored in the map.")] = None,
    timeout: Annotated[
        float, typer.Option(min=1, help="Seconds before the pytest run is stopped.")
    ] = 3600,
    python: Annotated[
        Path | None,
        typer.Option(
            help="The Python that runs the tests (the repository's own environment, with "
            "pytest and its test dependencies); default: this one."
        ),
    ] = None,
    installed: Annotated[
        str | None,
        typer.Option(
            help="The tests import this top-level package installed, not from the checkout "
            "(PyTorch's tests import the built torch; its Python files are recorded under the "
            "checkout's names). Default: the checkout's packages come first on the path."
        ),
    ] = None,
    since: Annotated[
        Path | None,
        typer.Option(
            help="An older map of this repository: run again only the test files the change "
            "since its revision edited, or whose tests executed a file it changed, and keep "
            "every other test's record (then the pytest arguments should be options only)."
        ),
    ] = None,
    lines: Annotated[
        bool,
        typer.Option(
            "--lines/--no-lines",
            help="Also record the lines each test executes (coverage.py, when the recording "
            "Python has it): a change to a few statements of a long function leads first to "
            "the tests that ran them.",
        ),
    ] = True,
) -> None:
    """Record which functions each test executes (arguments after -- go to pytest).
    Refuses (exit 1, no map written) when pytest collected nothing or ended in a
    collection error, naming the first error."""
    from test_selection.coverage.map import CoverageMap, CoverageMapError, refusal
    from test_selection.git import GitError, Repo

    try:
        sha = Repo(upstream).resolve(rev)
    except GitError as exc:
        raise _fail(str(exc)) from None
    update, older = _update_from(since, upstream, sha, repository) if since else (None, None)
    target = (output or Path(f"coverage-{sha[:12]}.json.gz")).resolve()
    interpreter = sys.executable
    if python is not None:  # a path is the caller's (pytest runs in the worktree), a name PATH's
        interpreter = str(python.absolute()) if os.sep in str(python) else str(python)
    name = repository or repository_name(upstream)
    if installed is not None and not installed.isidentifier():
        raise _fail(f"--installed {installed!r}: not a package name")
    with tempfile.TemporaryDirectory(prefix="ci-relay-coverage-") as scratch:
        tree = Path(scratch) / "tree"
        written = Path(scratch) / "map.json.gz"  # moved to the target only if it is usable
        try:
            Repo(upstream).run("worktree", "add", "--detach", "--quiet", "--", str(tree), sha)
        except GitError as exc:
            raise _fail(str(exc)) from None
        args = list(ctx.args)
        if update is not None and update.rerun is not None:
            args += update.rerun
        try:
            if update is not None and update.rerun == []:
                code, seconds = 0, 0.0
                CoverageMap(name, sha, backend, collected=0).save(written)
            else:
                code, seconds = _run_pytest(
                    tree, written, name, sha, backend, args, timeout, interpreter, installed, lines
                )
        finally:
            subprocess.run(
                ["git", "-C", str(upstream), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
                check=False,
            )
        if not written.is_file():
            raise _fail(f"pytest ended with exit code {code} and wrote no map", 1)
        try:
            cmap = CoverageMap.load(written)
        except CoverageMapError as exc:
            raise _fail(str(exc), 1) from None
        if update is not None and older is not None:
            out.print(f"since {older.revision[:12]}: {update.reason}", soft_wrap=True)
            if update.rerun == [] or (update.kept and not cmap.tests and code == 5):
                code = 0  # nothing to run again: the kept records are the map
                cmap.collection_errors = []
            from test_selection.coverage.update import merged

            cmap = merged(cmap, update, older)
            cmap.save(written)
        problem = refusal(cmap) or PYTEST_EXITS.get(code)
        if problem:
            raise _fail(
                f"no map written: {problem} (pytest exit {code}, {len(cmap.tests)} test(s) "
                "recorded). A map that missed tests would pass them off as newer than it: "
                "fix the run, or leave out what cannot be collected (-- --ignore PATH)",
                1,
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(written), target)
    out.print(_recorded(cmap, f"{name}@{sha[:12]}", lines, seconds, code, target), soft_wrap=True)


def _recorded(cmap: Any, what: str, lines: bool, seconds: float, code: int, target: Path) -> str:
    """The line ``coverage record`` ends with: what the map holds, and where it went."""
    at_lines = (
        f" (and the lines of {len(cmap.lines)} of them)"
        if cmap.lines
        else (f"; no lines: {cmap.lines_missing}" if lines and cmap.lines_missing else "")
    )
    return (
        f"recorded {len(cmap.tests)} test(s) executing {len(cmap.functions())} function(s) of "
        f"{what}{at_lines} in {seconds:.1f} s (pytest exit {code}) -> {target} "
        f"({target.stat().st_size / 1024:.0f} KB)"
    )


def _update_from(since: Path, upstream: Path, sha: str, repository: str | None) -> tuple[Any, Any]:
    """What ``--since MAP`` runs again and keeps (``coverage_update.plan_update``)."""
    from test_selection.coverage.map import CoverageMap, CoverageMapError
    from test_selection.coverage.update import changes_between, plan_update
    from test_selection.git import GitError, Repo
    from test_selection.inventory import is_test_path
    from test_selection.layout import (
        configured,
        detect_layout,
        not_recursed,
        pytest_settings,
        recursed,
        settings_change,
    )

    repo = Repo(upstream)
    try:
        older = CoverageMap.load(since)
    except CoverageMapError as exc:
        raise _fail(f"--since: {exc}") from None
    name = repository or repository_name(upstream)
    if older.repository and older.repository != name:
        raise _fail(f"--since: the map is of {older.repository!r}, this upstream is {name!r}")
    try:
        changed, bodies = changes_between(repo, older.revision, sha)
        files = repo.text("ls-tree", "-r", "-z", "--name-only", "--end-of-options", sha)
    except GitError as exc:
        raise _fail(f"--since: the map's revision {older.revision[:12]}: {exc}") from None
    patterns = detect_layout(repo, sha).patterns
    # the files to run again are named to pytest, which then enters folders it never walks
    # into (norecursedirs): those are left out as a plain run leaves them
    now = pytest_settings(repo, sha)
    skipped = not_recursed(configured(now))
    tests = {
        p for p in files.split("\0") if p and is_test_path(p, patterns) and recursed(p, skipped)
    }
    settings = settings_change(pytest_settings(repo, older.revision), now)
    update = plan_update(older, changed, tests, lambda p: p in tests, settings, bodies)
    return update, older


def _check_interpreter(python: str, env: dict[str, str]) -> None:
    """Refuse a named Python that cannot run the recorder: missing, without pytest (with
    the tree importable: an old pytest may need the very package under test), or too old."""
    try:
        proc = subprocess.run(
            [python, "-c", "import sys, pytest; print(sys.version_info >= (3, 11))"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _fail(f"--python {python}: cannot run it ({exc})") from None
    if proc.returncode != 0:
        raise _fail(f"--python {python}: cannot import pytest ({proc.stderr.strip()[-300:]})")
    if proc.stdout.strip() != "True":
        raise _fail(f"--python {python}: the recorder needs Python 3.11 or newer")


def _run_pytest(
    tree: Path,
    target: Path,
    name: str,
    sha: str,
    backend: str | None,
    args: list[str],
    timeout: float,
    python: str = sys.executable,
    installed: str | None = None,
    lines: bool = False,
) -> tuple[int, float]:
    """Plain pytest in the worktree with the recorder; the package importable from the tree
    (flat or src/ layout) ahead of any installed copy, unless ``installed`` names the package
    the tests import installed (then neither the tree nor the working folder is on the path,
    and that package's installed files count as the tree's). Another Python gets the
    recorder from a folder holding only ``test_selection`` (nothing else of this project
    shadows the repository's own modules)."""
    paths = [str(tree), *([str(tree / "src")] if (tree / "src").is_dir() else [])]
    if installed is not None:
        paths = []
    if python != sys.executable:
        plugin = tree.parent / "plugin"
        plugin.mkdir(exist_ok=True)
        import test_selection

        (plugin / "test_selection").symlink_to(Path(test_selection.__file__).resolve().parent)
        paths.append(str(plugin))
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *inherited])}
    env.pop("PYTEST_ADDOPTS", None)
    if python != sys.executable:
        _check_interpreter(python, env)
    keep = ["-P"] if installed is not None else []  # -P: the working folder not on the path
    packages = ["--coverage-package", installed] if installed is not None else []
    command = [
        python, *keep, "-m", "pytest", "-p", "test_selection.coverage_recorder", *packages,
        "--record-coverage", str(target), "--coverage-root", str(tree),
        "--coverage-repository", name, "--coverage-revision", sha,
        "-p", "no:cacheprovider", "-q", *(["--coverage-backend", backend] if backend else []),
        *(["--coverage-lines"] if lines else []), *args,
    ]  # fmt: skip
    ran = follow_pytest(
        command, cwd=tree, env=env, timeout=timeout, scratch=tree.parent, label=name
    )
    if ran.timed_out:
        raise _fail(f"the tests passed the {timeout:.0f} s timeout; no map written", 1)
    if ran.code in (0, 5):
        err.print(escape(f"pytest: {ran.summary()}"), soft_wrap=True)
    else:  # failures, or a run that did not test what it was asked to: what pytest said
        err.print(escape(f"pytest exit {ran.code}; its last lines:\n{ran.tail()}"), soft_wrap=True)
    return ran.code, ran.seconds


@coverage_app.command("show")
def show(
    path: Annotated[Path, typer.Argument(help="A map written by coverage record or the relay.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    top: Annotated[int, typer.Option(min=0, help="Functions to list, most tests first.")] = 10,
) -> None:
    """Summarise a coverage map: what it covers, its busiest functions, its flags."""
    from test_selection.coverage.map import CoverageMap, CoverageMapError

    try:
        cmap = CoverageMap.load(path)
    except CoverageMapError as exc:
        raise _fail(str(exc)) from None
    index = cmap.index()
    busiest = sorted(index.by_function.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:top]
    flags: dict[str, int] = {}
    for marks in cmap.flags.values():
        for mark in marks:
            flags[mark] = flags.get(mark, 0) + 1
    files = sorted({f for f, _ in index.by_function})
    size = path.stat().st_size
    rows = [{"function": f"{f}:{q}", "tests": len(t)} for (f, q), t in busiest]
    summary = {
        "repository": cmap.repository,
        "revision": cmap.revision,
        "backend": cmap.backend,
        "recorded_at": cmap.recorded_at,
        "seconds": round(cmap.seconds, 1),
        "tests": len(cmap.tests),
        "functions": len(index.by_function),
        "files": len(files),
        "bytes": size,
        "flags": flags,
        "busiest": rows,
        "tests_with_lines": len(cmap.lines),
        "lines_missing": cmap.lines_missing,
    }
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    out.print(
        f"{cmap.repository}@{cmap.revision[:12]}"
        + (f" on {cmap.backend}" if cmap.backend else "")
        + f", recorded {cmap.recorded_at} in {cmap.seconds:.1f} s",
        soft_wrap=True,
    )
    out.print(
        f"{summary['tests']} test(s), {summary['functions']} function(s) in {len(files)} "
        f"file(s), {size / 1024:.0f} KB",
    )
    if cmap.lines:
        out.print(f"lines executed: recorded for {len(cmap.lines)} test(s)")
    else:
        out.print(f"lines executed: not recorded{': ' if cmap.lines_missing else ''}"
                  f"{cmap.lines_missing}", soft_wrap=True)  # fmt: skip
    for mark, count in sorted(flags.items()):
        out.print(f"flagged {mark}: {count} test(s) (recorded as far as the profiler saw)")
    for row in rows:
        out.print(f"  {row['tests']:>6}  {row['function']}", soft_wrap=True)
