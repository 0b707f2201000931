"""The figures and the printed report of ``bench/bench_mutation.py``, read from its record
(what ``--json`` keeps), so ``--load`` prints a saved run the same way."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

GOALS = {"caught@0.05": 0.99, "recall@0.15": 0.90}


def figures(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per ``selector@budget``: caught, recall, mean share and tests, mean seconds, over the
    mutants that failed at least one test."""
    killed = [r for r in record["rows"] if r["status"] == "killed"]
    keys = sorted({k for r in killed for k in r["results"]})
    out: dict[str, dict[str, float]] = {}
    for key in keys:
        results = [r["results"][key] for r in killed if key in r["results"]]
        failing = sum(len(r["failing"]) for r in killed if key in r["results"])
        out[key] = {
            "mutants": len(results),
            "caught": sum(1 for x in results if x["found"]) / len(results),
            "recall": sum(len(x["found"]) for x in results) / failing if failing else 0.0,
            "mean_recall": statistics.mean(
                len(r["results"][key]["found"]) / len(r["failing"])
                for r in killed
                if key in r["results"]
            ),
            "share": statistics.mean(x["share"] for x in results),
            "median_share": statistics.median(x["share"] for x in results),
            "tests": statistics.mean(x["tests"] for x in results),
            "seconds": statistics.mean(x["seconds"] for x in results),
        }
    return out


def print_report(record: dict[str, Any], out: Any = print) -> None:
    rows = record["rows"]
    by_status: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_status[r["status"]].append(r)
    out(
        f"\n{len(rows)} mutants: {len(by_status['killed'])} fail tests, "
        f"{len(by_status['equivalent'])} fail nothing, {len(by_status['untested'])} reached "
        f"by no passing test, {len(by_status['unchanged'])} changed no value, "
        f"{len(by_status['error'])} not applied"
    )
    table = figures(record)
    budgets = sorted({float(k.rsplit("@", 1)[1]) for k in table})
    names = sorted({k.rsplit("@", 1)[0] for k in table}, key=lambda n: (n == "combo", n))
    out(f"\n{'budget':>7} {'selector':<14} {'caught':>8} {'recall':>8} {'per-mut':>8} "
        f"{'tests':>8} {'share':>7} {'median':>7} {'s/sel':>7}")  # fmt: skip
    for budget in budgets:
        for name in names:
            f = table.get(f"{name}@{budget}")
            if f is None:
                continue
            out(
                f"{budget:>6.0%} {name:<14} {f['caught']:>8.3f} {f['recall']:>8.3f} "
                f"{f['mean_recall']:>8.3f} {f['tests']:>8.1f} {f['share']:>7.3f} "
                f"{f['median_share']:>7.3f} {f['seconds']:>7.2f}"
            )
        if "combo" in names and "selector" in names:
            s, c = table[f"selector@{budget}"], table[f"combo@{budget}"]
            out(
                f"{'':>7} selector - combo: caught {s['caught'] - c['caught']:+.3f}, "
                f"recall {s['recall'] - c['recall']:+.3f}"
            )
    for key, goal in GOALS.items():
        metric, budget = key.split("@")
        for name in names:
            f = table.get(f"{name}@{budget}")
            if f is not None:
                verdict = "met" if f[metric] >= goal else "missed"
                out(f"goal {metric} >= {goal} at {float(budget):.0%}: {name} {verdict}")
    out("\nfailing tests missed, by cause:")
    for key in sorted(table):
        causes: dict[str, int] = defaultdict(int)
        for r in by_status["killed"]:
            for cause in r["results"].get(key, {}).get("misses", {}).values():
                causes[cause] += 1
        listed = ", ".join(f"{c} {n}" for c, n in sorted(causes.items())) or "none"
        out(f"  {key}: {listed}")
    out(
        "recall: failing tests in the plan / failing tests; per-mut: the mean of it per mutant; "
        "tests: mean tests in the plan; share: its mean share of the universe; median: the "
        "median share"
    )
    used: dict[str, int] = defaultdict(int)
    for r in by_status["killed"]:
        for key, result in r["results"].items():
            if result.get("coverage"):
                used[f"{key}: {result['coverage']}"] += 1
    if used:
        out("coverage map use: " + ", ".join(f"{k} {n}" for k, n in sorted(used.items())))
    for r in by_status["killed"]:
        if r.get("timed_out"):
            out(f"cut at --timeout (truth partial): {r['ident']}, {len(r['failing'])} failing")
    for status in ("equivalent", "untested", "unchanged", "error"):
        for r in by_status[status]:
            why = r.get("error", "")
            out(f"{status}: {r['ident']} ({r['description']}) {why}".rstrip())
