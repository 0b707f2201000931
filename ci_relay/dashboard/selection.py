"""Reading a stored ``TestPlan`` for people: reasons grouped by stage, outcomes per test.

The plan names generic tests (``file::TestX::test_y``) while results name executed
variants (``file::TestXCPU::test_y_cpu_float32``); matching them here lets the run
page say, next to each reason, what actually happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ci_relay.dashboard.paging import Pager
from ci_relay.dashboard.selection_views import (
    CoverageView,
    DriftView,
    EvidenceItem,
    PlannedTestView,
    RankingCandidate,
    RankingView,
    SelectionView,
    StageEvidence,
    Variant,
)
from test_selection.variants import match_variants, split_nodeid

STAGE_ORDER = ("candidates", "agent", "plan")
__all__ = ["explain", "match_variants"]


def _stages(evidence: Any) -> list[StageEvidence]:
    grouped: dict[str, list[EvidenceItem]] = {}
    for item in evidence if isinstance(evidence, list) else []:
        if not isinstance(item, Mapping):
            continue
        grouped.setdefault(str(item.get("stage", "?")), []).append(
            EvidenceItem(
                source=str(item.get("source", "")),
                score=float(item.get("score", 0.0) or 0.0),
                reason=str(item.get("reason", "")),
            )
        )
    order = sorted(
        grouped, key=lambda s: (STAGE_ORDER.index(s) if s in STAGE_ORDER else len(STAGE_ORDER), s)
    )
    return [
        StageEvidence(stage, round(sum(i.score for i in grouped[stage]), 4), grouped[stage])
        for stage in order
    ]


def _planned(
    item: Mapping[str, Any], variants: Mapping[str, list[str]], outcomes: Mapping[str, str]
) -> PlannedTestView:
    test = str(item.get("test", ""))
    shard = item.get("shard")
    return PlannedTestView(
        test=test,
        file=str(item.get("file", split_nodeid(test)[0])),
        score=float(item.get("score", 0.0) or 0.0),
        mode=item.get("mode"),
        shard=int(shard) if isinstance(shard, int) else None,
        duration=float(item.get("duration", 0.0) or 0.0),
        reasons=[str(r) for r in item.get("reasons", []) or []],
        stages=_stages(item.get("evidence")),
        variants=[Variant(n, outcomes[n]) for n in sorted(variants.get(test, []))],
    )


def _page(items: list[Any], page: int, per_page: int) -> tuple[list[Any], Pager]:
    pager = Pager(min(page, max(1, -(-len(items) // per_page))), per_page, len(items))
    return items[pager.offset : pager.offset + per_page], pager


def explain(
    strategy: str,
    plan: Mapping[str, Any],
    outcomes: Mapping[str, str],
    selected_page: int = 1,
    excluded_page: int = 1,
    per_page: int = 100,
) -> SelectionView:
    """The run page's selection section: a page of selected and of left-out tests.

    ``outcomes`` maps the run's executed node ids to their outcomes.
    """
    selected = [t for t in plan.get("selected", []) or [] if isinstance(t, Mapping)]
    excluded = [t for t in plan.get("excluded", []) or [] if isinstance(t, Mapping)]
    variants = match_variants((str(t.get("test", "")) for t in selected), outcomes)
    shown_selected, selected_pager = _page(selected, selected_page, per_page)
    shown_excluded, excluded_pager = _page(excluded, excluded_page, per_page)
    change = plan.get("change")
    return SelectionView(
        strategy=strategy,
        base=plan.get("base"),
        head=plan.get("head"),
        budget=plan.get("budget"),
        agent=plan.get("agent"),
        universe_size=int(plan.get("universe_size", 0) or 0),
        selected_total=len(selected),
        excluded_total=len(excluded),
        shard_count=len(plan.get("shards", []) or []),
        notes=[str(n) for n in plan.get("notes", []) or []],
        change=dict(change) if isinstance(change, Mapping) else {},
        selected=[_planned(t, variants, outcomes) for t in shown_selected],
        selected_pager=selected_pager,
        excluded=[_planned(t, {}, outcomes) for t in shown_excluded],
        excluded_pager=excluded_pager,
        timings=_numbers(plan.get("timings")),
        shares=_numbers(plan.get("shares")),
        spec_drift=_drift(plan.get("spec_drift")),
        ranking=_ranking(plan.get("ranking")),
        coverage=_coverage(plan.get("coverage")),
        mode="safe" if plan.get("mode") == "safe" else "ranked",
    )


def _coverage(value: Any) -> CoverageView | None:
    """A stored plan's coverage map (none: selected without one)."""
    if not isinstance(value, Mapping) or not value.get("revision"):
        return None
    behind = value.get("commits_behind")
    known = value.get("known_functions")
    found = value.get("floor")
    floor: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    missed = [*(floor.get("unreached") or []), *(floor.get("unknown") or [])]
    return CoverageView(
        revision=str(value["revision"]),
        recorded_at=str(value.get("recorded_at") or ""),
        commits_behind=behind if isinstance(behind, int) else None,
        changed=int(value.get("changed_functions") or 0),
        known=len(known) if isinstance(known, list) else 0,
        tests_reached=int(value.get("tests_reached") or 0),
        used=USES.get(str(value.get("used") or ""), ""),
        floor_tests=len(floor.get("tests") or []),
        floor_reached=len(floor.get("reached") or []),
        floor_executed=int(_number(floor.get("executed_taken"))),
        floor_missed=[str(m) for m in missed][:20],
        floor_skipped=str(floor.get("skipped") or ""),
    )


# how a plan ranked with its map (``CoverageUse.used``), as the run page says it
USES = {
    "evidence": "as evidence (safe mode ranks nothing)",
    "prior": "its tests first in their files (prior numbers: too little history to measure it)",
    "hand": "as evidence beside the hand weights",  # plans made before they were retired
    "unused": "not used to rank: the backtest found no gain (the floor still uses it)",
    "reached-first": "its tests first in their files (the backtest found a gain)",
    "reached-files": "its files and tests first (the backtest found a gain)",
}


def _ranking(value: Any) -> RankingView | None:
    """A stored plan's ranking choice (older plans and hand-weighted ones have none)."""
    if not isinstance(value, Mapping) or not value.get("chosen"):
        return None
    chosen = str(value.get("chosen"))
    candidates = [
        RankingCandidate(
            name=str(c.get("ranking", "")),
            description=str(c.get("description", "")),
            file_recall=_number(c.get("file_recall")),
            test_recall=_number(c.get("edited_test_recall")),
            chosen=str(c.get("ranking", "")) == chosen
            and c.get("allocation") == value.get("allocation")
            and (c.get("coverage") or "") == (value.get("coverage") or "")
            and bool(c.get("sweeps")) == bool(value.get("sweeps"))
            and not c.get("trial"),
            trial=bool(c.get("trial")),
        )
        for c in value.get("candidates", []) or []
        if isinstance(c, Mapping)
    ]
    commits = value.get("backtest_commits")
    return RankingView(
        description=str(value.get("description", chosen)),
        reason=str(value.get("reason", "")),
        commits=commits if isinstance(commits, int) else 0,
        candidates=candidates,
    )


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _drift(value: Any) -> list[DriftView]:
    """A stored plan's spec drift (older plans have none; malformed items are left out)."""
    items = value if isinstance(value, list) else []
    return [
        DriftView(
            kind=str(item.get("kind", "")),
            file=str(item.get("file", "")),
            line=int(item["line"]) if isinstance(item.get("line"), int) else 0,
            listed=str(item.get("listed", "")),
            message=str(item.get("message", "")),
            likely=str(item["likely"]) if item.get("likely") else None,
        )
        for item in items
        if isinstance(item, Mapping)
    ]


def _numbers(value: Any) -> dict[str, float]:
    """A stored plan's ``{name: number}`` (older plans have none; nothing else is trusted)."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float)}
