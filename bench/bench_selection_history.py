"""Selection on real history, judged by the shared yardstick, leave one repository out.

The yardstick is ``select_eval.py``, the selection judge the project's steering keeps outside
this repository (pass its path with ``--yardstick``; read its docstring): for each of a
history's newest eligible commits it hides the commit's test edits, asks for tests from the
source change alone, and charges every selector by the test functions it runs. This bench
imports that script and replays the same commits with the same truth, universe and costs,
but calls ``select()`` in this process (the script's ``cmd:`` path starts one process per
commit; both give the same figures, ``--verify`` runs the script itself to show it), so a
grid of settings over several histories fits in one run:

- per history, per budget: test-file recall and edited-test recall of ``combo`` (the
  script's co-change + path words baseline, computed by the script's own functions) and of
  the selector under each setting, the tests' share and the seconds per change (cold: the
  first change of a history, fits and backtest included; warm: the median of the rest);
- a **leave-one-repository-out** table: each history's row uses the setting that, on the
  *other* histories, met the file-recall goal at both budgets and found the most edited tests;
- the goals of issue 24 per row, and at 15 % every miss by cause: never co-changed (no
  commit before it changed the test file with any of the changed sources), outranked, or
  a budget too small for the commit (its edited test files alone hold more tests).

Needs histories the search tool fetches (not in the repository); clone each to a scratch
folder (the yardstick adds objects and refs to it):

    # with the search tool: fetch github:pytorch/rl  (likewise the others)
    git clone -q --no-checkout $MIRROR_rl $SCRATCH/rl
    python bench/bench_selection_history.py --yardstick PATH/select_eval.py $SCRATCH/rl \\
        $SCRATCH/torchtune $SCRATCH/tensordict $SCRATCH/networkx $SCRATCH/dask --commits 200

(``$MIRROR_rl``: the bare git folder fetch printed for pytorch/rl; ``$SCRATCH``: any folder
outside this repository.)

``--coverage`` also replays every commit with a per-test coverage map (issue 34), recorded
with ``ci-relay coverage record`` at the parent of the oldest replayed commit (nothing the
replay asks about is in it), and prints the table with and without it. The history's tests
must run here: name the Python of an environment that has its test dependencies with
``--coverage-python NAME=PATH`` and extra pytest arguments with ``--coverage-args
NAME=ARGS`` (NAME: the clone's folder name). Maps are kept in ``--coverage-cache``.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Collection
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from history_report import (  # noqa: E402
    BUDGETS,
    MAP,
    ROLL,
    print_tables,
)
from rolling_maps import NIGHTLY, assign, record_series, run_record, schedule  # noqa: E402
from rolling_maps import git as rolling_git  # noqa: E402
from saved_runs import (  # noqa: E402
    DROP,
    Progress,
    compare,
    read_saved,
    revision,
    write_saved,
)
from yardstick import combo_ranking, eligible_commits, load_yardstick  # noqa: E402

from test_selection.coverage.floor import EXECUTED_SHARE  # noqa: E402
from test_selection.coverage.map import CoverageMap, CoverageMapError  # noqa: E402
from test_selection.selector import SelectorConfig, select  # noqa: E402
from test_selection.types import Budget  # noqa: E402

FILE_WEIGHTS = (0.1, 0.3)
# issue 34's goals with a coverage map: edited-test recall at least this per budget


def record_map(
    repo: str,
    commits: int,
    yardstick: str,
    cache: Path,
    python: str | None,
    pytest_args: list[str],
    timeout: float,
) -> dict[str, Any]:
    """The coverage map of ``repo`` at the parent of the oldest commit the replay takes,
    recorded with ``ci-relay coverage record`` (kept in ``cache``); what it holds, or why
    there is none."""
    ys = load_yardstick(Path(yardstick))
    _history, _diffs, eligible = eligible_commits(ys, repo, commits)
    if not eligible:
        return {"error": "no eligible commit"}
    revision = eligible[-1][1]
    name = Path(repo).name
    target = cache / f"{name}-{revision[:12]}.json.gz"
    info: dict[str, Any] = {"path": str(target), "revision": revision}
    if not target.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "ci_relay", "coverage", "record", "--upstream", repo,
            "--rev", revision, "-o", str(target), "--timeout", str(timeout),
            *(["--python", python] if python else []), "--", *pytest_args,
        ]  # fmt: skip
        print(f"  {name}: recording a coverage map at {revision[:12]}", file=sys.stderr)
        began = time.perf_counter()
        returncode, said = run_record(command)
        info["record_seconds"] = round(time.perf_counter() - began, 1)
        if returncode != 0 or not target.is_file():
            info["error"] = f"coverage record exit {returncode}: {said}"
            return info
    try:
        cmap = CoverageMap.load(target)
    except CoverageMapError as exc:
        info["error"] = str(exc)
        return info
    date = subprocess.run(
        ["git", "-C", repo, "show", "-s", "--format=%cs", revision],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    info.update(
        tests=len(cmap.tests),
        functions=len(cmap.functions()),
        megabytes=round(target.stat().st_size / 1e6, 2),
        date=date,
        seconds=round(cmap.seconds, 1),
    )
    return info


def rolling_series(
    repo: str,
    commits: int,
    yardstick: str,
    cache: Path,
    python: str | None,
    pytest_args: list[str],
    timeout: float,
    every: str,
    first: str,
) -> tuple[dict[str, str], dict[str, Any]]:
    """The rolling maps (``rolling_maps.py``): replayed commit -> map file, and what the
    series cost and refused. ``first``: the one-off map's revision, the series' start."""
    ys = load_yardstick(Path(yardstick))
    _history, _diffs, eligible = eligible_commits(ys, repo, commits)
    wanted = schedule(repo, eligible, every)
    stamps = {
        rev: int(rolling_git(repo, "show", "-s", "--format=%ct", rev).strip())
        for rev in {first, *wanted.values()}
    }
    order = sorted(stamps, key=lambda rev: (stamps[rev], rev != first))
    order.remove(first)
    order.insert(0, first)
    recorded = record_series(repo, order, cache, python, pytest_args, timeout)
    per_commit = assign(wanted, recorded, order)
    info = recorded.to_json()
    info["every"] = every
    info["fallbacks"] = sum(1 for c, rev in wanted.items() if rev not in recorded.paths)
    return per_commit, info


def replay(
    repo: str,
    commits: int,
    yardstick: str,
    weights: tuple[float, ...],
    agent_name: str,
    map_path: str | None = None,
    rolling: dict[str, str] | None = None,
    progress: str | None = None,
    sweeps: bool | None = None,
    floor: bool = True,
    executed_share: float = EXECUTED_SHARE,
    history_commits: int | None = None,
) -> dict[str, Any]:
    """Every commit of one history under combo and each setting, at every budget (with
    ``map_path``: each setting again with that coverage map; with ``rolling`` (commit -> map
    file), again with each commit's own map). ``progress``: a file each commit's row is
    appended to as it comes, and taken back from on a rerun with the same settings and code.
    ``history_commits``: the selector reads only this many commits before each change (a
    shallow clone's view: the short-history path)."""
    from test_selection.agents import agent_by_name

    ys = load_yardstick(Path(yardstick))
    coverage = CoverageMap.load(Path(map_path)).index() if map_path else None
    loaded: dict[str, Any] = {}

    def rolling_index(commit: str) -> Any:
        path = (rolling or {}).get(commit)
        if path is None:
            return None
        if path not in loaded:
            loaded.clear()  # the series moves forward: one map at a time
            loaded[path] = CoverageMap.load(Path(path)).index()
        return loaded[path]

    history, diffs, eligible = eligible_commits(ys, repo, commits)
    index = {c: i for i, (c, _p) in enumerate(history)}
    universe_cache: dict = {}
    blob_cache: dict = {}
    rows: list[dict[str, Any]] = []
    cache = Path(tempfile.mkdtemp(prefix="bench-selection-"))
    agent = agent_by_name(agent_name, cache)
    settings = {
        "commits": commits, "weights": list(weights), "agent": agent_name, "map": map_path,
        "rolling": rolling, "code": revision(ROOT), "sweeps": sweeps,
        "floor": floor,
        **({} if executed_share == EXECUTED_SHARE else {"executed_share": executed_share}),
        **({"history_commits": history_commits} if history_commits else {}),
    }  # fmt: skip
    saved = Progress(Path(progress), settings) if progress else None
    for number, (c, p, diff_rows, tests, srcs) in enumerate(eligible):
        kept = saved.get(c) if saved is not None else None
        if kept is not None:
            rows.append(kept)
            continue
        universe = ys.test_universe(repo, p, universe_cache)
        truth = {t for t in tests if t in set(universe)}
        if not truth:
            continue
        truth_tests = ys.edited_tests(repo, p, c, sorted(truth))
        counts = ys.test_counts(repo, p, universe, blob_cache)
        total = sum(counts.values())
        start = index[c] + 1
        before = history[start : start + 1500]
        cochange, combo_ranked = combo_ranking(ys, before, srcs, universe, diffs)
        head = ys.synthetic_head(repo, p, c, diff_rows)
        row: dict[str, Any] = {
            "commit": c,
            "truth": sorted(truth),
            "truth_tests": sorted(truth_tests),
            "truth_cost": sum(counts[t] for t in truth),
            "total": total,
            "cochanged": sorted(t for t in truth if cochange.get(t, 0) > 0),
            "results": {},
        }
        for budget in BUDGETS:
            picked = ys.fill(combo_ranked, counts, budget * total, 0, "tests")
            row["results"][f"combo@{budget}"] = _combo_result(
                picked, counts, total, truth, truth_tests
            )
            families: list[tuple[str, Any]] = [("", None)]
            if coverage is not None:
                families.append((MAP, coverage))
            if rolling_index(c) is not None:
                families.append((ROLL, rolling_index(c)))
            for weight in weights:
                for family, cov in families:
                    config = SelectorConfig(
                        budget=Budget("fraction", budget),
                        # a backtest cache per family: the selector keys a choice made with
                        # a map by repository, not by the map's revision (the relay keeps it
                        # while the anchor stands), so one shared cache would hand the
                        # rolling family the one-off map's choices
                        cache_dir=cache / (family.lstrip("+") or "none"),
                        file_weight=weight,
                        agent=agent,
                        coverage=cov,
                        sweeps=sweeps,
                        floor=floor,
                        executed_share=executed_share,
                        **({"history_commits": history_commits} if history_commits else {}),
                    )
                    began = time.perf_counter()
                    plan, _change = select(Path(repo), p, head, None, config)
                    seconds = time.perf_counter() - began
                    key = f"w{weight}{family}@{budget}"
                    row["results"][key] = _plan_result(plan, seconds, truth, truth_tests)
        rows.append(row)
        if saved is not None:
            saved.add(row)
        print(f"  {Path(repo).name}: {number + 1}/{len(eligible)}", file=sys.stderr, flush=True)
    return {
        "repo": repo,
        "rows": rows,
        "map": {"path": map_path} if map_path else None,
        "rolling": {"maps": rolling} if rolling else None,
    }


def _combo_result(
    picked: set[str],
    counts: dict[str, int],
    total: int,
    truth: set[str],
    truth_tests: Collection[str],
) -> dict[str, Any]:
    """What combo's test files (``picked``, filled to the budget; ``total``: the universe's
    test functions) found of the commit's truth: a test is chosen with its file."""
    return {
        "files": sorted(picked & truth),
        "tests": sorted(t for t in truth_tests if t.split("::", 1)[0] in picked),
        "share": sum(counts[f] for f in picked) / total,
        "seconds": 0.0,
    }


def _plan_result(
    plan: Any, seconds: float, truth: set[str], truth_tests: Collection[str]
) -> dict[str, Any]:
    """What one setting's plan found of the commit's truth, and how the selector chose it
    (ranking, map, sweeps, agent: what the report's misses and rankings read)."""
    files = {item.test.file for item in plan.selected}
    chosen = {item.test.nodeid.split("[", 1)[0] for item in plan.selected}
    return {
        "files": sorted(files & truth),
        "tests": sorted(t for t in truth_tests if t in chosen),
        "share": plan.shares()["tests"],
        "seconds": seconds,
        "ranking": plan.ranking.get("chosen", "hand"),
        "coverage": plan.ranking.get("coverage", ""),
        "sweeps": bool(plan.ranking.get("sweeps")),
        "known": len(plan.coverage.get("known_functions", [])),
        "lag": plan.coverage.get("commits_behind"),
        "agent": plan.agent,
        "rank_of_truth": _ranks(plan, truth),
    }


def _ranks(plan: Any, truth: set[str]) -> dict[str, int]:
    """Where the plan ranked each edited test file (by its best test), for the miss causes."""
    best: dict[str, float] = defaultdict(float)
    for item in [*plan.selected, *plan.excluded]:
        best[item.test.file] = max(best[item.test.file], item.score)
    order = sorted(best, key=lambda f: (-best[f], f))
    return {f: order.index(f) + 1 for f in truth if f in best}


def _parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("repos", nargs="*", help="clones of the histories (the yardstick writes refs)")
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument(
        "--yardstick",
        help="path of select_eval.py, the shared selection judge (not part of this "
        "repository); needed to replay, not with --load",
    )
    ap.add_argument("--file-weights", default=",".join(str(w) for w in FILE_WEIGHTS))
    ap.add_argument("--jobs", type=int, default=2, help="histories replayed at once")
    ap.add_argument("--agent", default="local", help="local (as ci-relay select) | none")
    ap.add_argument(
        "--verify",
        type=int,
        default=0,
        help="also run the yardstick itself (ci-relay select per commit) on the newest N",
    )
    ap.add_argument(
        "--coverage",
        action="store_true",
        help="also replay with a coverage map recorded before the oldest replayed commit",
    )
    ap.add_argument(
        "--coverage-python",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="the Python that runs history NAME's tests (repeatable)",
    )
    ap.add_argument(
        "--coverage-args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="pytest arguments for history NAME's tests (repeatable)",
    )
    ap.add_argument(
        "--coverage-cache",
        default=str(Path.home() / ".cache" / "ci-relay" / "bench-coverage"),
        help="where recorded maps are kept (a map is recorded once per history and revision)",
    )
    ap.add_argument("--coverage-timeout", type=float, default=3600)
    ap.add_argument(
        "--coverage-every",
        default=NIGHTLY,
        help="with --coverage, also the rolling maps: 'nightly' (default: each replayed "
        "commit selects with the map the nightly before its base's day would have recorded, "
        "as the relay does) or N (a map every N replayed commits); 0: none",
    )
    ap.add_argument("--save", help="write every per-commit result as JSON here")
    ap.add_argument(
        "--progress",
        default=str(Path.home() / ".cache" / "ci-relay" / "bench-progress"),
        help="each history's rows are appended to NAME.jsonl here as they come; a rerun "
        "with the same settings and code takes them back instead of replaying ('': off)",
    )
    ap.add_argument(
        "--sweeps",
        choices=("backtest", "on", "off"),
        default="backtest",
        help="sweeps run whole (SelectorConfig.sweeps): as the backtest finds (the default), "
        "always, or never",
    )
    ap.add_argument(
        "--no-floor",
        action="store_true",
        help="with a map, select without the coverage floor (what the floor adds)",
    )
    ap.add_argument(
        "--executed-share",
        type=float,
        default=EXECUTED_SHARE,
        help="with a map, the share of the budget the tests that executed a changed function "
        f"may take past the floor (SelectorConfig.executed_share, {EXECUTED_SHARE}; 0: the "
        "floor alone)",
    )
    ap.add_argument(
        "--history-commits",
        type=int,
        default=None,
        metavar="N",
        help="the selector reads only the N commits before each change, as in a clone of "
        "depth N (SelectorConfig.history_commits): the path short histories take",
    )
    ap.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="SAVED",
        help="a run saved with --save (bench/results/NAME.json): print each figure against "
        "it over the commits both replayed, and exit 1 when one fell by more than "
        f"{DROP} (repeatable)",
    )
    ap.add_argument(
        "--load",
        action="append",
        help="read results saved by --save instead of replaying (repeatable: one run per "
        "history can be saved apart and the table printed over all of them)",
    )
    return ap


def _replay_all(
    args: argparse.Namespace, weights: tuple[float, ...], made_by: dict[str, str]
) -> list[dict[str, Any]]:
    """Every history replayed (its maps recorded first, with ``--coverage``), saved with
    ``--save``."""
    pythons = dict(item.split("=", 1) for item in args.coverage_python)
    extra = {k: shlex.split(v) for k, v in (i.split("=", 1) for i in args.coverage_args)}
    maps: dict[str, dict[str, Any]] = {}
    series: dict[str, tuple[dict[str, str], dict[str, Any]]] = {}
    for r in args.repos if args.coverage else []:
        repo = str(Path(r).resolve())
        name = Path(repo).name
        maps[repo] = record_map(
            repo,
            args.commits,
            args.yardstick,
            Path(args.coverage_cache),
            pythons.get(name),
            extra.get(name, []),
            args.coverage_timeout,
        )
        if "error" in maps[repo]:
            print(f"  {name}: no coverage map: {maps[repo]['error']}", file=sys.stderr)
        elif args.coverage_every != "0":
            series[repo] = rolling_series(
                repo, args.commits, args.yardstick, Path(args.coverage_cache),
                pythons.get(name), extra.get(name, []), args.coverage_timeout,
                args.coverage_every, maps[repo]["revision"],
            )  # fmt: skip
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(
                replay,
                str(Path(r).resolve()),
                args.commits,
                args.yardstick,
                weights,
                args.agent,
                None
                if "error" in maps.get(str(Path(r).resolve()), {"error": ""})
                else maps[str(Path(r).resolve())]["path"],
                series.get(str(Path(r).resolve()), ({}, {}))[0] or None,
                str(Path(args.progress) / f"{Path(r).resolve().name}.jsonl")
                if args.progress
                else None,
                {"on": True, "off": False}.get(args.sweeps),
                not args.no_floor,
                args.executed_share,
                args.history_commits,
            )
            for r in args.repos
        ]
        results = [f.result() for f in futures]
    for result in results:
        result["made_by"] = made_by
    for result in results:
        if result["repo"] in maps:
            result["map"] = maps[result["repo"]]
        if result["repo"] in series:
            result["rolling_info"] = series[result["repo"]][1]
    if args.save:
        write_saved(Path(args.save), results)
    return results


def _verify(args: argparse.Namespace) -> None:
    """``--verify N``: the yardstick itself on the newest N, one ``ci-relay select`` each."""
    print(f"\nThe yardstick itself on the newest {args.verify} (one ci-relay select per commit):")
    for repo in args.repos:
        for budget in BUDGETS:
            command = [
                sys.executable,
                args.yardstick,
                "--repo",
                str(Path(repo).resolve()),
                "--max-commits",
                str(args.verify),
                "--budget",
                str(budget),
                "--selector",
                "combo",
                "--selector",
                "cmd:ci-relay select --upstream {upstream} --base {base} --head {head} "
                f"--budget {{budget}} --agent {args.agent} --json",
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            for line in done.stdout.splitlines():
                print(f"  {Path(repo).name} {budget:.0%} {line}")


def main() -> int:
    ap = _parser()
    args = ap.parse_args()
    made_by = {"code": revision(ROOT), "command": shlex.join(sys.argv)}  # before any replay
    if args.verify and not args.yardstick:
        ap.error("--verify runs the yardstick: name it with --yardstick")
    weights = tuple(float(w) for w in args.file_weights.split(","))
    if args.load:
        results = [r for path in args.load for r in read_saved(Path(path))]
        keys = set.intersection(*(set(r["rows"][0]["results"]) for r in results if r["rows"]))
        weights = tuple(
            sorted(
                {
                    float(k[1:].split("@")[0].removesuffix(ROLL).removesuffix(MAP))
                    for k in keys
                    if k[0] == "w"
                }
            )
        )
    else:
        if not args.repos:
            ap.error("name at least one history to replay (or --load saved runs)")
        if not args.yardstick or not Path(args.yardstick).is_file():
            print(
                f"name the yardstick with --yardstick PATH/select_eval.py (got {args.yardstick})",
                file=sys.stderr,
            )
            return 2
        results = _replay_all(args, weights, made_by)
    unmapped = print_tables(results, weights)
    if args.verify:
        _verify(args)
    if unmapped:
        # asked for maps and did not get them: the figures "with a map" are missing, not equal
        print(
            f"\nno coverage map for {', '.join(unmapped)}: their rows have no figure with a map "
            "(the reason is in the table above)",
            file=sys.stderr,
        )
        return 1
    return 1 if args.compare and _compared(args.compare, results) else 0


def _compared(paths: list[str], results: list[dict[str, Any]]) -> bool:
    """Print the figures against the saved runs; whether any fell by more than DROP."""
    saved = [r for path in paths for r in read_saved(Path(path))]
    lines, failed = compare(saved, results)
    print(f"\nAgainst the saved runs ({', '.join(paths)}), over the commits both replayed:")
    for line in lines:
        print(line)
    made = {r.get("made_by", {}).get("code", "?") for r in saved}
    print(
        f"saved by {', '.join(sorted(made))}; "
        + (f"a figure fell by more than {DROP}: see DROP above" if failed else "no figure fell")
    )
    return failed


if __name__ == "__main__":
    sys.exit(main())
