"""How a run or a test outcome reads on the dashboard: one status word, one colour class.

Kept apart from the queries so the grid, the commit page and the JSON API agree on
what "failure" means without each re-deriving it from run state and conclusion.
"""

from __future__ import annotations

from collections.abc import Mapping

from ci_relay.execution.outcomes import BAD_OUTCOMES

STATUSES = ("success", "failure", "error", "running", "pending", "neutral")
# what a failure list shows: outcomes that broke the run, and flaky ones (passed on rerun)
SHOWN_OUTCOMES = (*sorted(BAD_OUTCOMES), "flaky")
# count keys in the order a cell lists them: what needs attention first
COUNT_ORDER = (
    "failed",
    "error",
    "crashed",
    "xpass_strict",
    "flaky",
    "passed",
    "xfailed",
    "xpassed",
    "skipped",
)


def run_status(state: str, conclusion: str | None) -> str:
    """The cell colour of a run: finished runs by conclusion, others by progress."""
    if state == "completed":
        if conclusion in ("success", "failure", "error"):
            return conclusion
        return "neutral"  # the selector chose nothing, or an unknown conclusion
    if state == "failed":
        return "error"
    if state in ("selecting", "running"):
        return "running"
    return "pending"


# GitHub Actions conclusions (what other relays post) as the grid colours them
WORKFLOW_CONCLUSIONS = {
    "success": "success",
    "failure": "failure",
    "neutral": "neutral",
    "skipped": "neutral",
    "stale": "neutral",
    "cancelled": "error",
    "timed_out": "error",
    "action_required": "error",
    "startup_failure": "error",
    "error": "error",
}


def workflow_status(status: str, conclusion: str | None) -> str:
    """The cell colour of another relay's job: by conclusion once completed, else running."""
    if status == "completed":
        return WORKFLOW_CONCLUSIONS.get(conclusion or "", "neutral")
    return "running"


def ordered_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """Counts in a stable reading order (known outcomes first), zeros dropped."""
    known = [(k, int(counts[k])) for k in COUNT_ORDER if counts.get(k)]
    rest = sorted((k, int(v)) for k, v in counts.items() if k not in COUNT_ORDER and v)
    return dict(known + rest)


def pass_rate(counts: Mapping[str, int]) -> float | None:
    """Share of non-skipped results that did not break the run (flaky counts as passing)."""
    total = sum(int(v) for k, v in counts.items() if k != "skipped")
    if not total:
        return None
    bad = sum(int(v) for k, v in counts.items() if k in BAD_OUTCOMES)
    return (total - bad) / total
