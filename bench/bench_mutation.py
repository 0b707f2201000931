"""Break real code and see (issue 35): a mutation ground truth for selection.

For each of ``--count`` functions drawn with ``--seed`` from the code a repository's tests
exercise, a mutant (``bench/mutation_lib.py``: raise at entry, one element of a return value
wrong, two arguments swapped, an off-by-one, a keyword dropped) is applied in the test process
(``bench/mutation_plugin.py`` swaps the function's code; no file is edited) and the tests are
run: the tests that pass unmutated and fail (or crash, or hang past ``--timeout``) with it are
the truth. Mutants that fail nothing are reported (equivalent, or untested) and left out of the
rates. The same mutation is then a commit on the base revision (git objects and a ref under
``refs/mutation/``, the checkout untouched), and the selector is asked for a plan at each
budget, without and with a coverage map recorded on the unmutated tree; ``combo`` (the shared
yardstick's co-change + path words baseline, ``--yardstick``) is filled to the same budget of
test functions, as ``bench_selection_history.py`` does.

Printed per budget and selector: mutations caught (at least one failing test in the plan),
failing tests in the plan (recall), tests run (mean share of the universe), seconds per
selection; then the misses by cause and the mutants left out. ``--json FILE`` keeps the record.

Two kinds of repository:

- a Python repository whose tests import its own package from the checkout (networkx): the
  functions are those of its package, the tests of a mutant are the test files the coverage
  map says reached the function (``--scope reached``; ``--scope tests`` only the tests it
  says executed it, for files of thousands of tests; ``--scope all`` runs every test, the
  whole truth at the whole suite's cost), run with ``--python`` (its own environment);

      python bench/bench_mutation.py $SCRATCH/networkx --python $VENV/bin/python \\
          --coverage nx-map.json.gz --yardstick PATH/select_eval.py --count 100 --seed 1

- ``--installed torch``: a PyTorch-shaped tree (the sample upstream, or ``bench/real_tree.py``'s)
  whose tests import the installed torch: the functions are those of the installed ``torch/``
  files the tree also has (same path, same name), broken in the test process; the commit edits
  the tree's own copy of that function with the same operator.

      ci-relay sample-upstream /tmp/sample
      python bench/bench_mutation.py /tmp/sample --installed torch --count 6 \\
          --tests test/test_nn_functional.py --tests test/test_view_ops.py

  On real PyTorch test files (``bench/real_tree.py``), with the bench's own whole-file spec
  (``--reuse-file``, repeated; ``--dtypes``), only the tests that executed the function
  (``--scope tests``) and functions drawn from the folders named (``--under``):

      python bench/bench_mutation.py $SCRATCH/real-tree --installed torch --backend cpu \\
          --reuse-file test/test_view_ops.py --reuse-file test/nn/test_init.py ... \\
          --under torch/nn --under torch/autograd --record-coverage --scope tests \\
          --preload torch.testing._internal.common_utils --count 80

The coverage map (``--coverage FILE``, or ``--record-coverage`` to record one with ``ci-relay
coverage record`` first) also chooses the functions: only those a test executed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import mutation_lib as ml  # noqa: E402
from mutation_baseline import (  # noqa: E402
    mutant_scope,
    run_baseline,
    test_command,
    within,
    within_path,
)
from mutation_options import Options  # noqa: E402
from mutation_report import figures, print_report  # noqa: E402
from mutation_select import combo_all, select_all  # noqa: E402
from yardstick import load_yardstick  # noqa: E402

from test_selection.coverage.floor import EXECUTED_SHARE  # noqa: E402
from test_selection.coverage.map import CoverageIndex, CoverageMap  # noqa: E402

SKIP_PARTS = {"tests", "test", "testing", "benchmarks", "docs", "doc", "examples"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def _module_name(path: str) -> str:
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts and parts[0] == "src":
        parts = parts[1:]
    return ".".join(parts)


def _is_test_path(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def candidates(opts: Options, base: str) -> list[tuple[ml.Target, Path, str]]:
    """Every function that can be a mutant: its target, the file the tests import it from,
    and the repository's text of its file (what the commit edits)."""
    files = [f for f in _git(opts.repo, "ls-tree", "-r", "--name-only", base).splitlines()]
    out: list[tuple[ml.Target, Path, str]] = []
    installed_root: Path | None = None
    if opts.installed:
        spec = importlib.util.find_spec(opts.installed)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"{opts.installed} is not installed here")
        installed_root = Path(next(iter(spec.submodule_search_locations))).parent
    for path in files:
        if not path.endswith(".py") or _is_test_path(path):
            continue
        if SKIP_PARTS & set(path.split("/")[:-1]):
            continue
        if opts.installed and not path.startswith(opts.installed + "/"):
            continue
        text = _git(opts.repo, "show", f"{base}:{path}")
        names = set(ml.functions(text))
        runtime = opts.repo / path
        if installed_root is not None:
            runtime = installed_root / path
            if not runtime.is_file():
                continue
            names &= set(ml.functions(runtime.read_text()))
        elif runtime.read_text() != text:
            raise SystemExit(f"{path}: the checkout differs from {base}; check {base} out")
        for name in sorted(names):
            out.append((ml.Target(path, name, _module_name(path)), runtime, text))
    return out


def draw(
    opts: Options,
    pool: list[tuple[ml.Target, Path, str]],
    reached: set[tuple[str, str]] | None,
    testable: set[str] | None = None,
) -> tuple[list[ml.Mutant], list[str]]:
    """``opts.count`` mutants, functions and operators drawn with ``opts.seed`` (only functions
    a test reached, when a map says, and only ``testable`` ones, if given); notes on what could
    not be made."""
    by_key = {t.key: (t, r, text) for t, r, text in pool}
    notes: list[str] = []
    chosen: list[tuple[ml.Target, str | None]] = []
    if opts.targets:
        for file, qualname, op in opts.targets:
            key = f"{file}::{qualname}"
            if key not in by_key:
                raise SystemExit(f"no function {key} to mutate")
            chosen.append((by_key[key][0], op))
    else:
        eligible = [
            t
            for t, _r, _x in pool
            if _eligible(opts, t, reached) and (testable is None or t.key in testable)
        ]
        order = ml.choose_targets(eligible, len(eligible), opts.seed)
        chosen = [(t, None) for t in order]
    mutants: list[ml.Mutant] = []
    rng = random.Random(opts.seed)
    for target, op in chosen:
        if len(mutants) >= opts.count:
            break
        _t, runtime, text = by_key[target.key]
        ops = [op] if op else rng.sample(ml.OPERATORS, len(ml.OPERATORS))
        for operator in ops:
            try:
                mutants.append(ml.make_mutant(target, runtime, text, operator, opts.seed))
                break
            except (ValueError, SyntaxError) as exc:
                if op:
                    raise SystemExit(f"{target.key}: {exc}") from exc
        else:
            notes.append(f"{target.key}: no operator applies")
    return mutants, notes


def run(opts: Options, log: Any = print) -> dict[str, Any]:
    """The whole bench; the record (what ``--json`` writes)."""
    repo = opts.repo
    base = _git(repo, "rev-parse", opts.base).strip()
    cmap = CoverageMap.load(opts.coverage) if opts.coverage else None
    index = cmap.index() if cmap is not None else None
    reached = {f for f in cmap.functions()} if cmap is not None else None
    pool = candidates(opts, base)
    python_path = [] if opts.installed else [str(repo), *([str(repo / "src")])]
    cwd = Path(tempfile.mkdtemp(prefix="bench-mutation-"))
    runner = ml.Runner(opts.python, python_path, opts.preload)
    try:
        baseline: ml.RunResult | None = None
        testable: set[str] | None = None
        if index is not None and opts.scope != "all" and not opts.targets:
            # the unmutated run first, over every test that reached a function of the draw:
            # a function whose reaching tests do not pass cannot be caught by any selection
            eligible = [t for t, _r, _x in pool if _eligible(opts, t, reached)]
            scoped = {t.key: mutant_scope(opts, index, t) for t in eligible}
            baseline = run_baseline(opts, runner, cwd, base, list(scoped.values()), log)
            passing = {baseline.generic.get(n, n) for n in baseline.passed()}
            testable = {key for key, (_f, tests) in scoped.items() if tests & passing}
            log(f"{len(testable)} of {len(eligible)} functions reached by a passing test")
        mutants, notes = draw(opts, pool, reached, testable)
        log(f"{len(pool)} functions, {len(mutants)} mutants (seed {opts.seed})")
        # the tests of each mutant: its files, and (--scope tests) only those tests
        per_mutant: dict[str, tuple[list[str], set[str] | None]] = {}
        for m in mutants:
            if opts.scope == "all" or index is None:
                per_mutant[m.ident] = (list(opts.tests) or ["."], None)
            else:
                files_of, tests = mutant_scope(opts, index, m.target)
                per_mutant[m.ident] = (files_of, tests if opts.scope == "tests" else None)
        if baseline is None:
            baseline = run_baseline(opts, runner, cwd, base, list(per_mutant.values()), log)
        return _run(opts, runner, cwd, base, index, mutants, notes, per_mutant, baseline, log)
    finally:
        runner.close()


def _eligible(opts: Options, target: ml.Target, reached: set[tuple[str, str]] | None) -> bool:
    """A function the draw may take: one a test reached (with a map), under ``--under``."""
    if reached is not None and (target.file, target.qualname) not in reached:
        return False
    return not opts.under or any(within_path(target.file, u) for u in opts.under)


def _run(
    opts: Options,
    runner: ml.Runner,
    cwd: Path,
    base: str,
    index: CoverageIndex | None,
    mutants: list[ml.Mutant],
    notes: list[str],
    per_mutant: dict[str, tuple[list[str], set[str] | None]],
    baseline: ml.RunResult,
    log: Any,
) -> dict[str, Any]:
    repo = opts.repo
    yardstick = load_yardstick(opts.yardstick) if opts.yardstick else None
    combo_state: dict[str, Any] = {}
    if yardstick is not None:
        history, diffs = yardstick.history(str(repo), base, 1500)
        universe = yardstick.test_universe(str(repo), base, {})
        if opts.tests:  # the files the tests run from (a spec's): the same universe as select's
            universe = [u for u in universe if any(within_path(u, t) for t in opts.tests)]
        counts = yardstick.test_counts(str(repo), base, universe, {})
        combo_state = {"history": history, "diffs": diffs, "universe": universe, "counts": counts}
    cache = opts.cache_dir or Path(tempfile.mkdtemp(prefix="bench-mutation-cache-"))
    from test_selection.agents import agent_by_name

    agent = agent_by_name(opts.agent, cache)
    rows: list[dict[str, Any]] = []

    def record(rows: list[dict[str, Any]]) -> dict[str, Any]:
        out = {
            "repo": str(repo),
            "base": base,
            "seed": opts.seed,
            "count": opts.count,
            "installed": opts.installed,
            "coverage": str(opts.coverage) if opts.coverage else None,
            "scope": opts.scope,
            "executed_share": opts.executed_share,
            "baseline": {"tests": len(baseline.outcomes), "passed": len(baseline.passed())},
            "notes": notes,
            "rows": rows,
        }
        if opts.json is not None:  # after every mutant: a long run cut short keeps its rows
            opts.json.write_text(json.dumps({**out, "figures": figures(out)}, indent=1))
        return out

    known = _taken_back(opts, base)
    for number, m in enumerate(mutants, 1):
        if rows:
            record(rows)
        files, only = per_mutant[m.ident]
        row: dict[str, Any] = {**m.to_json(), "files": files, "results": {}}
        row.pop("runtime_source")
        if m.ident in known:  # its truth was run before: only the selections again
            row.update({k: v for k, v in known[m.ident].items() if k not in ("results", "head")})
            log(f"[{number}/{len(mutants)}] {m.ident}: {row['status']} (saved truth)")
            if row["status"] == "killed":
                select_all(opts, repo, base, m, set(row["failing"]), row, index, cache, agent)
                combo_all(opts, yardstick, combo_state, m, set(row["failing"]), row)
            rows.append(row)
            continue
        if not files:
            row.update(status="untested", failing=[], seconds=0.0)
            rows.append(row)
            log(f"[{number}/{len(mutants)}] {m.ident}: no test reached it")
            continue
        result = runner.run(
            cwd,
            repo,
            test_command(opts, files),
            opts.timeout,
            m,
            test_timeout=opts.test_timeout,
            only=only,
        )
        failing = ml.failing_tests(within(baseline, files, only), result)
        row.update(
            failing=sorted(failing),
            seconds=round(result.seconds, 2),
            timed_out=result.timed_out,
            restarts=result.restarts,
            applied=result.applied,
        )
        if result.perturbed:
            row["perturbed"] = result.perturbed
        if result.error:
            row["status"] = "error"
            row["error"] = result.error
        elif failing:
            row["status"] = "killed"
        elif (
            not any(baseline.outcomes.get(n) == "passed" for n in result.outcomes)
            and not result.collect_errors
        ):
            # the tests that reached it did not pass unmutated: none can tell
            row["status"] = "untested"
            row["error"] = "no test that reached it passes unmutated"
        elif m.operator == "return" and result.perturbed and not result.perturbed["changed"]:
            # the helper could not break what the function returned: no mutation ran
            row["status"] = "unchanged"
            row["error"] = "returned only " + ", ".join(result.perturbed["types"])
        else:
            row["status"] = "equivalent"
        log(
            f"[{number}/{len(mutants)}] {m.ident}: {row['status']}, {len(failing)} failing "
            f"of {len(result.outcomes)} run, {result.seconds:.1f} s"
        )
        if row["status"] != "killed":
            rows.append(row)
            continue
        select_all(opts, repo, base, m, failing, row, index, cache, agent)
        combo_all(opts, yardstick, combo_state, m, failing, row)
        rows.append(row)
    return record(rows)


def _taken_back(opts: Options, base: str) -> dict[str, dict[str, Any]]:
    """The mutants whose truth a run saved in ``--json`` with the same base, seed, count,
    map and scope (a long run cut short, or the selector changed since): their test runs are not
    repeated, only the selections (which are cheap, and are what changes)."""
    if opts.json is None or not opts.json.is_file():
        return {}
    try:
        saved = json.loads(opts.json.read_text())
    except (OSError, ValueError):
        return {}
    same = (
        saved.get("base"),
        saved.get("seed"),
        saved.get("count"),
        saved.get("coverage"),
        saved.get("scope"),
    ) == (base, opts.seed, opts.count, str(opts.coverage) if opts.coverage else None, opts.scope)
    return {r["ident"]: r for r in saved.get("rows", []) if "status" in r} if same else {}


def whole_file_spec(repo: Path, files: list[str], dtypes: str) -> Path:
    """A reuse spec that runs every test of ``files`` (each must be in the checkout), with
    ``dtypes`` as its supported dtypes; written to a temporary folder."""
    for f in files:
        if f.startswith("/") or ".." in Path(f).parts or not (repo / f).is_file():
            raise SystemExit(f"--reuse-file {f}: no such test file in {repo}")
    lines = ["test_suite_config:", "  files:"]
    for f in files:
        lines += [f"    - path: ${{TORCH_ROOT}}/{f}", "      unlisted_test_mode: mandatory_success"]
    names = [d.strip() for d in dtypes.split(",") if d.strip()]
    if names:
        lines += ["  global:", "    supported_dtypes:", *(f"      - name: {d}" for d in names)]
    out = Path(tempfile.mkdtemp(prefix="bench-mutation-spec-")) / "spec.yaml"
    out.write_text("\n".join(lines) + "\n")
    return out


def parse(argv: list[str]) -> Options:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("repo", type=Path, help="a git checkout at the base revision")
    ap.add_argument("--python", default=sys.executable, help="the Python that runs its tests")
    ap.add_argument("--installed", help="the tests import this package installed (torch)")
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's run")
    ap.add_argument(
        "--test-timeout", type=float, default=60.0, help="a test running longer hangs (crashed)"
    )
    ap.add_argument("--budgets", default="0.05,0.15")
    ap.add_argument("--coverage", type=Path, help="a coverage map of the base revision")
    ap.add_argument("--record-coverage", action="store_true", help="record the map first")
    ap.add_argument(
        "--scope",
        choices=("reached", "tests", "all"),
        default="reached",
        help="run the files the map says reached the function (reached), only the tests it "
        "says executed it (tests: for files of thousands of tests), or every test (all)",
    )
    ap.add_argument("--tests", action="append", default=[], help="test paths to run")
    ap.add_argument("--spec", action="append", type=Path, default=[])
    ap.add_argument(
        "--reuse-file",
        action="append",
        default=[],
        help="an upstream test file the bench's own spec reuses whole (repeat; instead of "
        "--spec: the tests it runs, records and selects from)",
    )
    ap.add_argument(
        "--dtypes", default="", help="that spec's supported dtypes, comma-separated (default all)"
    )
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--agent", default="none", choices=("none", "local"))
    ap.add_argument("--yardstick", type=Path, help="the shared select_eval.py (for combo)")
    ap.add_argument("--target", action="append", default=[], help="FILE::QUALNAME::OPERATOR")
    ap.add_argument(
        "--under",
        action="append",
        default=[],
        help="draw only functions of this file or folder (repeat; e.g. torch/nn: one test "
        "that compiles reaches thousands of torch/_inductor functions no other test runs)",
    )
    ap.add_argument(
        "--executed-share",
        type=float,
        default=EXECUTED_SHARE,
        help="selector+map: the share of the budget the other tests that executed a changed "
        f"function may take past the floor ({EXECUTED_SHARE}, the default)",
    )
    ap.add_argument("--json", type=Path, help="write the record here")
    ap.add_argument("--pytest-arg", action="append", default=[])
    ap.add_argument("--baseline", type=Path, help="keep the unmutated outcomes here (JSON)")
    ap.add_argument(
        "--preload",
        action="append",
        default=[],
        help="import this once in a fork server that forks each run (torch's testing helpers)",
    )
    args = ap.parse_args(argv)
    if args.count < 1 or args.timeout <= 0 or args.test_timeout <= 0:
        ap.error("--count, --timeout and --test-timeout must be positive")
    if not (args.repo / ".git").exists():
        ap.error(f"{args.repo} is not a git checkout")
    budgets = tuple(float(b) for b in args.budgets.split(","))
    if not all(0 < b <= 1 for b in budgets):
        ap.error("--budgets are fractions in (0, 1]")
    specs = [s.resolve() for s in args.spec]
    if args.reuse_file:
        if specs:
            ap.error("--reuse-file writes the bench's own spec: give it or --spec, not both")
        specs = [whole_file_spec(args.repo.resolve(), args.reuse_file, args.dtypes)]
        args.tests = args.tests or list(args.reuse_file)
    targets = []
    for spec in args.target:
        parts = spec.split("::")
        if len(parts) != 3 or parts[2] not in ml.OPERATORS:
            ap.error(f"--target {spec!r}: FILE::QUALNAME::OPERATOR ({', '.join(ml.OPERATORS)})")
        targets.append((parts[0], parts[1], parts[2]))
    opts = Options(
        repo=args.repo.resolve(),
        python=args.python,
        installed=args.installed,
        count=args.count,
        seed=args.seed,
        timeout=args.timeout,
        test_timeout=args.test_timeout,
        budgets=budgets,
        coverage=args.coverage,
        scope=args.scope,
        tests=args.tests,
        specs=specs,
        backend=args.backend,
        agent=args.agent,
        yardstick=args.yardstick,
        targets=targets,
        pytest_args=args.pytest_arg,
        json=args.json,
        preload=args.preload,
        executed_share=args.executed_share,
        baseline=args.baseline,
        under=args.under,
    )
    if args.record_coverage and opts.coverage is None:
        opts.coverage = record_map(opts)
    return opts


def record_map(opts: Options) -> Path:
    out = Path(tempfile.mkdtemp(prefix="bench-mutation-map-")) / "map.json.gz"
    command = [
        sys.executable, "-m", "ci_relay", "coverage", "record", "--upstream", str(opts.repo),
        "--rev", opts.base, "-o", str(out), "--python", opts.python,
        *(["--installed", opts.installed] if opts.installed else []), "--",
        *(opts.tests or []), *opts.pytest_args,
    ]  # fmt: skip
    subprocess.run(command, check=True, cwd=ROOT)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--load"] and len(args) == 2:  # print a saved record again
        print_report(json.loads(Path(args[1]).read_text()))
        return 0
    opts = parse(args)
    record = run(opts, log=lambda line: print(line, file=sys.stderr, flush=True))
    print_report(record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
