"""The history bench's report: what no selector could reach (the ceiling), why edited tests
were missed (by cause, and by what a coverage map knew of them), and the table with and
without maps. Read from the rows ``bench_selection_history.py`` saves, so ``--load`` prints
the same tables as a replay."""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from saved_runs import figures  # noqa: E402

from test_selection.coverage.map import CoverageMap  # noqa: E402

BUDGETS = (0.15, 0.05)
GOAL_FILE_MARGIN = 0.05  # test-file recall >= combo + this, at both budgets
GOAL_TEST_MARGIN = 0.10  # edited-test recall >= combo + this at 15 % ...
GOAL_TEST_FLOOR = 0.90  # ... and at least this
MAP_GOALS = {0.15: 0.90, 0.05: 0.75}
MAP = "+cov"  # the suffix of a setting that selects with the one-off coverage map
ROLL = "+roll"  # ... with the rolling maps, as fresh as the relay's nightly (rolling_maps.py)
FAMILY_NAMES = {"": "no map", MAP: "the one-off map", ROLL: "the rolling maps"}
SWEEP = 10  # a commit that edited this many tests or more is counted as a sweep


def ceiling(rows: list[dict[str, Any]], budget: float) -> float:
    """The edited-test recall no selector can pass at this budget: a commit's edited tests
    beyond the budget's share of its test functions cannot all be run (a sweep that edits
    more tests than the budget holds). Each test function costs one, as the yardstick counts."""
    truth = sum(len(r["truth_tests"]) for r in rows)
    fits = sum(min(len(r["truth_tests"]), budget * r["total"]) for r in rows)
    return fits / truth if truth else 0.0


def missed_tests(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    """Edited tests not chosen: their file not reached at all, or reached but the budget
    went to other tests of it."""
    out: dict[str, int] = defaultdict(int)
    for r in rows:
        files = set(r["results"][key]["files"])
        found = set(r["results"][key]["tests"])
        sweep = len(r["truth_tests"]) >= SWEEP
        for t in r["truth_tests"]:
            if t not in found:
                reached = t.split("::", 1)[0] in files
                cause = "file reached, test not chosen" if reached else "file not reached"
                out[cause + (f" (in a sweep of {SWEEP}+)" if sweep else "")] += 1
    return dict(out)


def map_misses(result: dict[str, Any], key: str, family: str = MAP) -> dict[str, int]:
    """Edited tests a plan with a map missed, by what its map knew of them: in a sweep (a
    commit that edited ``SWEEP`` tests or more: a reformatting, a dependency bump), not in
    the map at all (the test is newer than the map), in it but it executed none of the
    functions the commit changed, or it executed one and the plan still did not choose it."""
    from test_selection.change_analysis import analyze
    from test_selection.coverage.select import changed_functions
    from test_selection.git import GitError, Repo

    if family == ROLL:
        paths = (result.get("rolling") or {}).get("maps") or {}
    else:
        path = (result.get("map") or {}).get("path")
        paths = {r["commit"]: path for r in result["rows"]} if path else {}
    repo = Repo(Path(result["repo"]))
    out: dict[str, int] = defaultdict(int)
    indexes: dict[str, Any] = {}
    for r in result["rows"]:
        missed = [t for t in r["truth_tests"] if t not in r["results"][key]["tests"]]
        path = paths.get(r["commit"])
        if not missed or not path or not Path(path).is_file():
            continue
        if len(r["truth_tests"]) >= SWEEP:
            out[f"in a sweep (a commit editing {SWEEP}+ tests)"] += len(missed)
            continue
        if path not in indexes:
            indexes.clear()
            indexes[path] = CoverageMap.load(Path(path)).index()
        index = indexes[path]
        try:
            change = analyze(repo, f"{r['commit']}^", r["commit"], exclude=set(r["truth"]))
        except GitError:
            continue
        targets = [
            f for names in changed_functions(change).values() for file, name in names
            for f in index.resolve(file, name)
        ]  # fmt: skip
        reached = index.reaches(targets)
        for test in missed:
            if test not in index.size:
                out["not in the map (newer than it)"] += 1
            elif test not in reached:
                out["in the map, executed no changed function"] += 1
            else:
                out["executed a changed function, not chosen"] += 1
    return dict(out)


def misses(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for r in rows:
        found = set(r["results"][key]["files"])
        budget_tests = float(key.rsplit("@", 1)[1]) * r["total"]
        for f in r["truth"]:
            if f in found:
                continue
            if r["truth_cost"] > budget_tests:
                out["budget too small for the commit"] += 1
            elif f not in r["cochanged"]:
                out["never co-changed"] += 1
            else:
                out["outranked"] += 1
    return dict(out)


def print_map_table(
    names: list[str],
    results: list[dict[str, Any]],
    chosen: Any,
    has: Any,
) -> None:
    """Issue 45's table: each history's LOO setting with no map, the one-off map and the
    rolling maps, at both budgets, beside combo; the goals per row."""
    print(
        "\nNo map, the one-off map, the rolling maps (LOO settings; goals: edited-test recall "
        ">= 0.90 at 15 %, >= 0.75 at 5 %, never below combo; file recall not below no map)"
    )
    print(
        "| history | maps (one-off: revision, date, tests; rolling: maps, refused, median "
        "commits behind) | 15 %: file none / one-off / rolling (combo) | edited none / "
        "one-off / rolling (combo) | 5 %: file | edited | edited-test ceiling 15 % / 5 % | "
        "goals (best map) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for k, (name, result) in enumerate(zip(names, results, strict=True)):
        families = [f for f in ("", MAP, ROLL) if has(result, f)]
        if len(families) == 1:
            info = result.get("map") or {}
            print(f"| {name} | none: {info.get('error', 'not asked for')} | | | | | | |")
            continue
        rows = result["rows"]
        cells, goals = [], []
        best = ROLL if ROLL in families else MAP
        for budget in BUDGETS:
            base = figures(rows, f"combo@{budget}")
            figs = {f: figures(rows, f"w{chosen(k, f)}{f}@{budget}") for f in families}
            for figure in ("file", "test"):
                shown = " / ".join(
                    f"{figs[f][figure]:.3f}" if f in figs else "—" for f in ("", MAP, ROLL)
                )
                cells.append(f"{shown} ({base[figure]:.3f})")
                if figs[best][figure] < base[figure]:
                    goals.append(f"{figure} {budget:.0%} below combo")
            if figs[best]["file"] < figs[""]["file"]:
                goals.append(f"file {budget:.0%} {figs[best]['file'] - figs['']['file']:+.3f}")
            if figs[best]["test"] < MAP_GOALS[budget]:
                goals.append(
                    f"edited {budget:.0%} {figs[best]['test']:.3f} < {MAP_GOALS[budget]}"
                    + (" (above the ceiling)" if ceiling(rows, budget) < MAP_GOALS[budget] else "")
                )
        info = result.get("map") or {}
        rolling = result.get("rolling_info") or {}
        lags = [
            r["results"][f"w{chosen(k, ROLL)}{ROLL}@0.15"].get("lag")
            for r in rows
            if f"w{chosen(k, ROLL)}{ROLL}@0.15" in r["results"]
        ]
        lags = [x for x in lags if isinstance(x, int)]
        once = [
            r["results"][f"w{chosen(k, MAP)}{MAP}@0.15"].get("lag")
            for r in rows
            if f"w{chosen(k, MAP)}{MAP}@0.15" in r["results"]
        ]
        once = [x for x in once if isinstance(x, int)]
        described = (
            f"{str(info.get('revision', '?'))[:10]}, {info.get('date', '?')}, "
            f"{info.get('tests', '?')} (median {statistics.median(once) if once else '?'} "
            f"behind); {len(rolling.get('paths', {}))}, {len(rolling.get('refused', {}))}, "
            f"{statistics.median(lags) if lags else '?'}"
        )
        print(
            f"| {name} | {described} | {' | '.join(cells)} | "
            f"{ceiling(rows, 0.15):.3f} / {ceiling(rows, 0.05):.3f} | "
            f"{'met' if not goals else '; '.join(goals)} |"
        )


def print_settings(
    names: list[str], results: list[dict[str, Any]], families: list[str], weights: tuple[float, ...]
) -> None:
    """Every setting's figures per history, combo first: what the leave-one-out choice
    picks from."""
    print(
        "\nPer history and setting (file recall / edited-test recall [changes with an edited "
        "test in the plan, per-change mean of edited-test recall] at 15 % and 5 %):"
    )
    for name, result in zip(names, results, strict=True):
        rows = result["rows"]
        line = [f"{name} ({len(rows)} changes)"]
        for setting in ["combo", *[f"w{w}{f}" for f in families for w in weights]]:
            if rows and f"{setting}@0.15" not in rows[0]["results"]:
                continue
            parts = []
            for budget in BUDGETS:
                fig = figures(rows, f"{setting}@{budget}")
                parts.append(
                    f"{fig['file']:.3f}/{fig['test']:.3f} "
                    f"[{fig['caught']:.3f}, {fig['per_change']:.3f}]"
                )
            line.append(f"{setting} {' '.join(parts)}")
        print("  " + " | ".join(line))


def print_loo_table(
    names: list[str], results: list[dict[str, Any]], family: str, chosen: Any, has: Any
) -> None:
    """One family's leave-one-repository-out table: each history under the setting chosen
    on the others, beside combo, with the goals of issue 24 it missed."""
    print(
        "\nLeave one repository out"
        + (f" with {FAMILY_NAMES[family]}" if family else "")
        + " (each row: the setting that, on the other histories, met "
        "the file-recall goal everywhere and found the most edited tests)"
    )
    print(
        "| history | setting | 15 %: file recall (combo) | edited-test recall (combo) | "
        "5 %: file recall (combo) | edited-test recall (combo) | share 15 % | "
        "s/change cold / warm | goals |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for k, (name, result) in enumerate(zip(names, results, strict=True)):
        if not has(result, family):
            continue
        best = chosen(k, family)
        setting = f"w{best}{family}"
        rows = result["rows"]
        cells, goals = [], []
        for budget in BUDGETS:
            ours, base = figures(rows, f"{setting}@{budget}"), figures(rows, f"combo@{budget}")
            cells += [
                f"{ours['file']:.3f} ({base['file']:.3f})",
                f"{ours['test']:.3f} ({base['test']:.3f})",
            ]
            if ours["file"] < base["file"] + GOAL_FILE_MARGIN:
                goals.append(f"file {budget:.0%} {ours['file'] - base['file']:+.3f}")
            if ours["test"] < base["test"]:
                goals.append(f"edited {budget:.0%} below combo")
            if budget == 0.15:
                if ours["test"] < base["test"] + GOAL_TEST_MARGIN:
                    goals.append(f"edited 15% {ours['test'] - base['test']:+.3f}")
                if ours["test"] < GOAL_TEST_FLOOR:
                    goals.append(f"edited 15% {ours['test']:.3f} < {GOAL_TEST_FLOOR}")
        main_fig = figures(rows, f"{setting}@0.15")
        print(
            f"| {name} | file weight {best} | {' | '.join(cells)} | {main_fig['share']:.3f} | "
            f"{main_fig['cold']:.1f} / {main_fig['warm']:.2f} | "
            f"{'met' if not goals else '; '.join(goals)} |"
        )


def print_misses(
    names: list[str], results: list[dict[str, Any]], families: list[str], chosen: Any, has: Any
) -> None:
    """The LOO setting's misses at 15 % by cause (and, with a map, by what the map knew),
    and the rankings its plans chose."""
    print("\nMisses at 15 % by cause (the LOO setting):")
    for k, (name, result) in enumerate(zip(names, results, strict=True)):
        for family in families:
            if not has(result, family):
                continue
            best = chosen(k, family)
            key = f"w{best}{family}@0.15"
            rankings: dict[str, int] = defaultdict(int)
            for r in result["rows"]:
                got = r["results"][key]
                used = got.get("coverage")
                rankings[
                    got.get("ranking", "?")
                    + (f" {used}" if used else "")
                    + (" sweeps" if got.get("sweeps") else "")
                ] += 1
            causes = misses(result["rows"], key)
            tests = missed_tests(result["rows"], key)
            label = f"{name}{f' with {FAMILY_NAMES[family]}' if family else ''}"
            print(f"  {label}: edited test files {causes}; edited tests {tests}")
            if family:
                print(f"  {' ' * len(label)}  edited tests missed, by the map: "
                      f"{map_misses(result, key, family)}")  # fmt: skip
            print(f"  {' ' * len(label)}  rankings chosen: {dict(rankings)}")


def print_tables(results: list[dict[str, Any]], weights: tuple[float, ...]) -> list[str]:
    """The tables: per history and setting, leave one repository out, with maps, the misses.
    Returns the histories that were to have a map and did not get one."""
    names = [Path(r["repo"]).name for r in results]
    mapped = any(
        k.endswith(f"{MAP}@0.15") for r in results if r["rows"] for k in r["rows"][0]["results"]
    )
    rolled = any(
        k.endswith(f"{ROLL}@0.15") for r in results if r["rows"] for k in r["rows"][0]["results"]
    )
    families = ["", *([MAP] if mapped else []), *([ROLL] if rolled else [])]
    print_settings(names, results, families, weights)

    def has(result: dict[str, Any], family: str) -> bool:
        return (
            bool(result["rows"]) and f"w{weights[0]}{family}@0.15" in result["rows"][0]["results"]
        )

    def score(others: list[dict[str, Any]], weight: float, family: str) -> tuple[bool, float]:
        """How a setting did on the other histories: first whether it met the file-recall goal
        on every one of them at both budgets, then its edited-test recall summed (the figure
        that says whether the right tests inside a file were chosen)."""
        met, tests = True, 0.0
        for result in others:
            for b in BUDGETS:
                ours = figures(result["rows"], f"w{weight}{family}@{b}")
                base = figures(result["rows"], f"combo@{b}")
                met = met and ours["file"] >= base["file"] + GOAL_FILE_MARGIN
                tests += ours["test"]
        return met, tests

    def chosen(k: int, family: str = "") -> float:
        others = [r for j, r in enumerate(results) if j != k and has(r, family)] or [results[k]]
        return max(weights, key=lambda w: score(others, w, family))

    for family in families:
        print_loo_table(names, results, family, chosen, has)
    unmapped = [n for n, r in zip(names, results, strict=True) if "error" in (r.get("map") or {})]
    if mapped or rolled or unmapped:
        print_map_table(names, results, chosen, has)
    print_misses(names, results, families, chosen, has)
    return unmapped
