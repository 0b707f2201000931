"""How ``bench/bench_mutation.py`` judges a mutant that failed tests: the mutation as a commit,
the selector's plan at each budget under each variant (without and with the coverage map),
the yardstick's ``combo`` filled to the same budget, and what each plan found of the failing
tests (the misses by cause)."""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any

import mutation_lib as ml
from mutation_options import Options

from test_selection.coverage.map import CoverageIndex
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget


def _generic(test: str) -> str:
    return test.split("[", 1)[0]


def score_plan(plan: Any, failing: set[str]) -> tuple[set[str], dict[str, str], int, int]:
    """Failing tests in the plan, the cause of each one not in it, tests run, universe."""
    chosen = {_generic(item.test.nodeid) for item in plan.selected}
    files = {item.test.file for item in plan.selected}
    scored = {_generic(item.test.nodeid): item.score for item in plan.excluded}
    found = failing & chosen
    causes = {}
    for test in sorted(failing - found):
        if test.split("::", 1)[0] not in files:
            causes[test] = "file not reached"
        elif scored.get(test, 0.0) > 0:
            causes[test] = "budget"
        else:
            causes[test] = "test not chosen"
    return found, causes, len(plan.selected), plan.universe_size


def select_all(
    opts: Options,
    repo: Path,
    base: str,
    m: ml.Mutant,
    failing: set[str],
    row: dict[str, Any],
    index: CoverageIndex | None,
    cache: Path,
    agent: Any,
) -> None:
    """The mutation as a commit on the base, and each variant's plan at each budget."""
    head = ml.commit_mutant(repo, base, m)
    row["head"] = head
    safe: dict[str, Any] | None = None
    for budget in opts.budgets:
        for label, idx, how in variants(index):
            if how == "safe" and safe is not None:  # no budget: the same plan at each
                row["results"][f"{label}@{budget}"] = safe
                continue
            config = SelectorConfig(
                budget=Budget("fraction", budget), cache_dir=cache, agent=agent, coverage=idx,
                floor=how != "no-floor", mode="safe" if how == "safe" else "ranked",
                executed_share=0.0 if how == "floor-only" else opts.executed_share,
            )  # fmt: skip
            began = time.perf_counter()
            plan, _change = select(repo, base, head, opts.specs or None, config)
            seconds = time.perf_counter() - began
            found, causes, ran, universe_size = score_plan(plan, failing)
            row["results"][f"{label}@{budget}"] = {
                "found": sorted(found),
                "misses": causes,
                "tests": ran,
                "share": ran / universe_size if universe_size else 0.0,
                "seconds": round(seconds, 3),
                "ranking": plan.ranking.get("chosen", "hand"),
                "coverage": plan.coverage.get("used", "") if idx is not None else "",
            }
            if how == "safe":
                safe = row["results"][f"{label}@{budget}"]


def combo_all(
    opts: Options,
    yardstick: ModuleType | None,
    combo_state: dict[str, Any],
    m: ml.Mutant,
    failing: set[str],
    row: dict[str, Any],
) -> None:
    """The yardstick's combo at each budget."""
    for budget in opts.budgets:
        if yardstick is not None:
            row["results"][f"combo@{budget}"] = combo(yardstick, combo_state, m, failing, budget)


def variants(index: Any) -> list[tuple[str, Any, str]]:
    """The selections each mutant is judged under: without the map; with it (the coverage
    floor and the other executing tests first, as the relay selects); with the floor but not
    the other executing tests (what they add); with it but no floor (what the floor adds);
    and safe mode with it (no budget)."""
    if index is None:
        return [("selector", None, "")]
    return [
        ("selector", None, ""),
        ("selector+map", index, ""),
        ("map-floor-only", index, "floor-only"),
        ("map-no-floor", index, "no-floor"),
        ("safe+map", index, "safe"),
    ]


def combo(
    ys: ModuleType, state: dict[str, Any], m: ml.Mutant, failing: set[str], budget: float
) -> dict[str, Any]:
    """The yardstick's combo for the mutant's file, filled to ``budget`` of the test
    functions; a failing test is in its plan when its file is."""
    began = time.perf_counter()
    universe, counts = state["universe"], state["counts"]
    srcs = {m.target.file}
    score = ys.cochange_scores(state["history"], srcs, set(universe), state["diffs"])
    src_tokens = set().union(*(ys.tokens(s) for s in srcs))
    for t in universe:
        overlap = len(ys.tokens(t) & src_tokens)
        if overlap:
            score[t] = score.get(t, 0.0) + 0.25 * overlap
    ranked = sorted(score, key=lambda t: (-score[t], t))
    total = sum(counts.values())
    picked = ys.fill(ranked, counts, budget * total, 0, "tests")
    found = {t for t in failing if t.split("::", 1)[0] in picked}
    causes = {
        t: ("budget" if score.get(t.split("::", 1)[0], 0) > 0 else "file not reached")
        for t in sorted(failing - found)
    }
    ran = sum(counts[f] for f in picked)
    return {
        "found": sorted(found),
        "misses": causes,
        "tests": ran,
        "share": ran / total if total else 0.0,
        "seconds": round(time.perf_counter() - began, 3),
    }
