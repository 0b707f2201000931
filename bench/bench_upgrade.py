"""Release upgrade on real history: does ``ci-relay upgrade`` pick every test whose outcome
changes between two releases, and how much of the suite does it pick?

For a repository with release tags whose tests run here (pytorch/tensordict: pure Python
plus a 100-line pybind11 extension this script compiles), the script

1. checks out A and B (git worktrees in a scratch folder), builds each side's extension;
2. runs the whole test universe of the spec (the files you name) at A and at B with plain
   pytest, each side importing its own package, and lists every test (generic name, its
   parametrizations folded: failed if any failed) whose outcome differs, or that is new at B;
3. times the upgrade analysis (``test_selection.upgrade.spec_impact.plan_upgrade``) on A..B
   and on a range of ``--wide`` commits ending at B, next to the time the whole-universe run
   at B took;
4. prints (a) the share of B's tests the upgrade selected, (b) recall of the outcome changes,
   with every miss and why, (c) the analysis time and its ratio to the full run.

Get the history (never into this repository)::

    # with the search tool: fetch github:pytorch/tensordict, then
    git clone $MIRROR_tensordict $SCRATCH/tensordict
    python -m venv --system-site-packages $SCRATCH/td-venv
    $SCRATCH/td-venv/bin/pip install --no-deps pyvers pybind11 importlib_metadata zipp

Run::

    python bench/bench_upgrade.py $SCRATCH/tensordict --from v0.13.0 --to v0.14.0 \\
        --python $SCRATCH/td-venv/bin/python --files test/tensordict/test_tensorclass.py ...

``--sample`` runs the same measurement on the sample upstream (first commit -> last), with no
extension to build.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from test_selection.inventory import parse_test_file  # noqa: E402
from test_selection.upgrade.spec_impact import plan_upgrade  # noqa: E402
from test_selection.variants import match_variants  # noqa: E402

BAD = {"failed", "error"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextmanager
def worktree(repo: Path, rev: str, scratch: Path) -> Iterator[Path]:
    path = scratch / f"tree-{rev.replace('/', '_')}"
    git(repo, "worktree", "add", "--detach", "--force", str(path), rev)
    try:
        yield path
    finally:
        git(repo, "worktree", "remove", "--force", str(path))


def build_extension(tree: Path, python: str) -> None:
    """tensordict's ``_C`` (pybind11, no torch headers), compiled in place."""
    csrc = tree / "tensordict" / "csrc"
    if not csrc.is_dir():
        return
    includes = subprocess.run(
        [python, "-m", "pybind11", "--includes"], capture_output=True, text=True, check=True
    ).stdout.split()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    sources = [str(p) for p in sorted(csrc.glob("*.cpp"))]
    target = tree / "tensordict" / f"_C{suffix}"
    subprocess.run(
        ["c++", "-O1", "-shared", "-fPIC", "-std=c++17", *includes, *sources, "-o", str(target)],
        check=True,
    )


def junit_id(classname: str, name: str) -> str:
    """A junit test case as a pytest node id (``file::Class::name[param]``)."""
    parts = classname.split(".")
    # the module path ends where a capitalised class name starts (pytest's convention)
    split = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
    file = "/".join(parts[:split]) + ".py"
    cls = ".".join(parts[split:])
    return f"{file}::{cls}::{name}" if cls else f"{file}::{name}"


def generic_tests(tree: Path, files: list[str]) -> list[str]:
    """The generic tests of the files, read with ast (what specs and the upgrade name)."""
    out: list[str] = []
    for file in files:
        path = tree / file
        if path.is_file():
            parsed = parse_test_file(file, "", path.read_bytes())
            out += [t.id.nodeid for t in parsed.tests]
    return out


def run_universe(
    tree: Path,
    files: list[str],
    python: str,
    import_tree: bool,
    timeout: float,
    per_test: float | None = None,
    saved_junit: Path | None = None,
) -> tuple[dict[str, str], float]:
    """Every test's folded outcome at this tree, and the wall time of the run."""
    junit = saved_junit or tree.parent / f"{tree.name}-junit.xml"
    if saved_junit is not None:
        return fold_junit(junit, tree, files), float("nan")
    extra = [f"--timeout={per_test:g}"] if per_test else []  # pytest-timeout autoloads
    env_path = str(tree) if import_tree else ""
    present = [str(tree / f) for f in files if (tree / f).is_file()]
    started = time.perf_counter()
    # cwd outside the tree: `python -m pytest` puts the cwd on sys.path, and a tree whose
    # package must not be imported (the sample's stand-in torch/) would shadow the real one
    proc = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            *present,
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tree),
            "--junitxml",
            str(junit),
            *extra,
        ],
        cwd=tree.parent,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path, "HOME": str(tree.parent)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    seconds = time.perf_counter() - started
    if not junit.exists():
        raise SystemExit(
            f"pytest wrote no junit at {tree}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return fold_junit(junit, tree, files), seconds


def fold_junit(junit: Path, tree: Path, files: list[str]) -> dict[str, str]:
    """junit test cases folded onto the generic tests (failed if any variant failed)."""
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    ids = [
        junit_id(c.get("classname", ""), re.sub(r"\[.*\]$", "", c.get("name", ""))) for c in cases
    ]
    owners = {v: g for g, vs in match_variants(generic_tests(tree, files), ids).items() for v in vs}
    outcomes: dict[str, str] = {}
    for case, nodeid in zip(cases, ids, strict=True):
        test = owners.get(nodeid, nodeid)
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        previous = outcomes.get(test)
        if previous in BAD or (previous == "passed" and outcome == "skipped"):
            continue
        outcomes[test] = outcome
    return outcomes


def spec_for(files: list[str], folder: Path) -> Path:
    spec = folder / "bench-spec.yaml"
    lines = ["test_suite_config:", "  files:"]
    lines += [
        f"    - path: ${{TORCH_ROOT}}/{f}\n      unlisted_test_mode: mandatory_success"
        for f in files
    ]
    spec.write_text("\n".join(lines) + "\n")
    return spec


def _history(
    args: argparse.Namespace, parser: argparse.ArgumentParser, scratch: Path
) -> tuple[Path, str, str, list[str], bool]:
    """The repository, the two revisions, the spec's files, and whether the tests import the
    tree's own package: the named history, or (``--sample``) the sample upstream built in
    ``scratch``."""
    import_tree = True
    if args.sample:
        from ci_relay.sample_upstream import build_sample_upstream

        sample = build_sample_upstream(scratch / "sample")
        repo, base, head = sample.path, sample.commits[0].sha, sample.commits[-1].sha
        files = sorted(
            p
            for p in git(repo, "ls-tree", "-r", "--name-only", head).splitlines()
            if p.startswith("test/test_")
        )
        import_tree = False  # its torch/ is a stand-in for diffs, never imported
    else:
        if args.repo is None or not args.base or not args.head or not args.files:
            parser.error("REPO, --from, --to and --files are needed (or --sample)")
        repo, base, head, files = args.repo.resolve(), args.base, args.head, args.files
    return repo, base, head, files, import_tree


def _outcomes(
    args: argparse.Namespace,
    repo: Path,
    revisions: tuple[str, str],
    files: list[str],
    import_tree: bool,
    scratch: Path,
) -> tuple[dict[str, dict[str, str]], dict[str, float]]:
    """Each side's (A, B) folded outcomes and the seconds its run took: read from
    ``--outcomes`` when it exists, else run (and then written there)."""
    base_sha, head_sha = revisions
    outcomes: dict[str, dict[str, str]] = {}
    seconds: dict[str, float] = {}
    if args.outcomes is not None and args.outcomes.exists():
        saved = json.loads(args.outcomes.read_text())
        outcomes, seconds = saved["outcomes"], saved["seconds"]
        print(f"outcomes read from {args.outcomes} (runs of {saved['base']}..{saved['head']})")
    for side, rev in (("A", base_sha), ("B", head_sha)):
        if side in outcomes:
            continue
        with worktree(repo, rev, scratch) as tree:
            build_extension(tree, args.python)
            print(f"running the whole universe at {side} ({len(files)} files)…", flush=True)
            outcomes[side], seconds[side] = run_universe(
                tree,
                files,
                args.python,
                import_tree,
                args.timeout,
                args.per_test_timeout,
                args.junit_a if side == "A" else None,
            )
            print(f"  {len(outcomes[side])} tests in {seconds[side]:.0f} s", flush=True)

    if args.outcomes is not None and not args.outcomes.exists():
        args.outcomes.write_text(
            json.dumps(
                {"base": base_sha, "head": head_sha, "outcomes": outcomes, "seconds": seconds}
            )
        )
    return outcomes, seconds


def picked(test: str, selected: set[str]) -> bool:
    """Whether the upgrade selected ``test``: a generic test the junit names differently
    from the AST (e.g. nested classes) is matched by file and name when the exact id is
    absent."""
    if test in selected:
        return True
    file, _, rest = test.partition("::")
    return any(
        s.startswith(file + "::") and s.endswith("::" + rest.rsplit("::", 1)[-1]) for s in selected
    )


def _time_wide_range(repo: Path, head_sha: str, wide: int, spec: Path) -> None:
    """The analysis timed on ``--wide`` first-parent commits ending at B (none when the
    history is shorter)."""
    wide_base = git(repo, "rev-list", "--first-parent", f"--skip={wide}", "-1", head_sha)
    if wide_base:
        wide_commits = int(git(repo, "rev-list", "--count", f"{wide_base}..{head_sha}"))
        started = time.perf_counter()
        plan = plan_upgrade(repo, wide_base, head_sha, [spec])
        wide_seconds = time.perf_counter() - started
        print(
            f"    wide range: {wide_commits} commits analysed in {wide_seconds:.2f} s "
            f"({len(plan.diff.run_list())} of {plan.diff.tests_at_head} tests selected)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path, nargs="?")
    parser.add_argument("--from", dest="base")
    parser.add_argument("--to", dest="head")
    parser.add_argument("--files", nargs="+", default=[], help="the spec's test files")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--wide", type=int, default=1000, help="commits of the timing range")
    parser.add_argument("--timeout", type=float, default=3600, help="per side, seconds")
    parser.add_argument(
        "--per-test-timeout",
        type=float,
        help="end a hanging test after this many seconds (needs pytest-timeout in --python's "
        "environment); it then counts as failed",
    )
    parser.add_argument(
        "--junit-a",
        type=Path,
        help="A's junit XML from an earlier run of the same files (A is not run again)",
    )
    parser.add_argument("--sample", action="store_true", help="the sample upstream instead")
    parser.add_argument(
        "--outcomes",
        type=Path,
        help="a JSON file: read the two sides' outcomes from it when it exists (no test run), "
        "else write them there after running",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-upgrade-") as scratch_name:
        scratch = Path(scratch_name)
        repo, base, head, files, import_tree = _history(args, parser, scratch)
        base_sha, head_sha = git(repo, "rev-parse", base), git(repo, "rev-parse", head)
        commits = int(git(repo, "rev-list", "--count", f"{base_sha}..{head_sha}"))
        print(
            f"{repo.name}: {base} ({base_sha[:10]}) .. {head} ({head_sha[:10]}), {commits} commits"
        )
        spec = spec_for(files, scratch)

        started = time.perf_counter()
        plan = plan_upgrade(repo, base_sha, head_sha, [spec])
        analysis = time.perf_counter() - started
        selected = set(plan.diff.run_list())
        print(
            f"analysis: {analysis:.2f} s; {len(selected)} of {plan.diff.tests_at_head} tests "
            f"selected ({plan.diff.by_kind()})"
        )

        outcomes, seconds = _outcomes(args, repo, (base_sha, head_sha), files, import_tree, scratch)
        at_a, at_b = outcomes["A"], outcomes["B"]
        changed = {t for t, o in at_b.items() if at_a.get(t) != o}
        caught = {t for t in changed if picked(t, selected)}
        share = len(selected) / max(1, plan.diff.tests_at_head)
        recall = len(caught) / len(changed) if changed else 1.0
        print()
        print(
            f"(a) selected: {share:.1%} of B's tests ({len(selected)} / {plan.diff.tests_at_head})"
        )
        print(f"(b) recall of outcome changes: {recall:.3f} ({len(caught)} / {len(changed)})")
        for test in sorted(changed - caught):
            print(f"    missed: {test}: {at_a.get(test, 'not at A')} -> {at_b[test]}")
        print(
            f"(c) analysis {analysis:.2f} s = {analysis / seconds['B']:.2%} of running B's "
            f"universe ({seconds['B']:.0f} s)"
        )
        _time_wide_range(repo, head_sha, args.wide, spec)
        goal = recall == 1.0 and share <= 0.30 and analysis < 60
        verdict = "met" if goal else "NOT met"
        print(f"goal (recall 1.0 at <= 30 % selected, analysis < 60 s): {verdict}")


if __name__ == "__main__":
    main()
