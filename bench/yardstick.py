"""The shared yardstick (``select_eval.py``, outside this repository: ``--yardstick`` names
it) as the benches use it: loaded as a module, its own rule for the commits it judges, and its
``combo`` baseline's ranking, computed by its own functions so the figures are the script's."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_yardstick(path: Path) -> ModuleType:
    """The yardstick script imported as the module ``select_eval`` (not run)."""
    spec = importlib.util.spec_from_file_location("select_eval", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the yardstick {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eligible_commits(ys: ModuleType, repo: str, commits: int) -> tuple[list, dict, list]:
    """The script's own eligibility rule, newest first (as its main() applies it)."""
    history, diffs = ys.history(repo, "HEAD", 1500 + 3000)
    found = []
    for c, p in history:
        rows = diffs[c]
        tests = [path for st, path in rows if st == "M" and ys.is_test(path)]
        srcs = [path for st, path in rows if ys.is_source(path)]
        if tests and srcs and len(rows) <= 60:
            found.append((c, p, rows, tests, srcs))
    return history, diffs, found[:commits]


def combo_ranking(
    ys: ModuleType, before: list, srcs: list[str], universe: list[str], diffs: dict
) -> tuple[dict[str, float], list[str]]:
    """The yardstick's combo for a commit's sources, computed by the script's own functions:
    the co-change scores (kept for the miss causes) and combo's ranking of the test files
    (co-change plus a quarter per path word shared with a changed source)."""
    cochange = ys.cochange_scores(before, set(srcs), set(universe), diffs)
    src_tokens = set().union(*(ys.tokens(s) for s in srcs))
    combo = dict(cochange)
    for t in universe:
        overlap = len(ys.tokens(t) & src_tokens)
        if overlap:
            combo[t] = combo.get(t, 0.0) + 0.25 * overlap
    return cochange, sorted(combo, key=lambda t: (-combo[t], t))
