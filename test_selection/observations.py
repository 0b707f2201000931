"""What past runs say about each test: how long it takes, how often it fails, how flaky it is.

The relay stores results of executed variants; the selector plans generic tests. These
observations, matched to the generic tests of the inventory (:mod:`test_selection.variants`),
replace the one-second guess in time budgets and sharding, and feed the failure-history
signal. PyTorch's ``test-times.json`` (per file) stays the fallback for tests never run.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from test_selection.types import TestId
from test_selection.variants import match_variants

FAILED = frozenset({"failed", "error", "crashed"})


@dataclass(frozen=True)
class Observation:
    """One executed variant's result in one past run (newest runs first is not required)."""

    nodeid: str
    outcome: str  # passed | failed | error | crashed | skipped | xfailed | flaky | ...
    duration: float
    run: int  # the run it belongs to: a test's variants in one run add up


@dataclass
class Learned:
    """Per generic test: seconds per run (median over runs), failures and flakes seen."""

    seconds: dict[TestId, float] = field(default_factory=dict)
    failures: dict[TestId, int] = field(default_factory=dict)
    flakes: dict[TestId, int] = field(default_factory=dict)
    runs_seen: int = 0


def learn(observations: Iterable[Observation], tests: Iterable[TestId]) -> Learned:
    """Match observations to ``tests`` and summarise them."""
    observed = list(observations)
    by_nodeid = {t.nodeid: t for t in tests}
    owners = match_variants(by_nodeid, {o.nodeid for o in observed})
    owner_of = {variant: by_nodeid[generic] for generic, vs in owners.items() for variant in vs}
    per_run: dict[TestId, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    learned = Learned(runs_seen=len({o.run for o in observed}))
    for obs in observed:
        test = owner_of.get(obs.nodeid)
        if test is None:
            continue  # a test that no longer exists
        if obs.outcome != "skipped":
            per_run[test][obs.run] += max(0.0, obs.duration)
        if obs.outcome in FAILED:
            learned.failures[test] = learned.failures.get(test, 0) + 1
        elif obs.outcome == "flaky":
            learned.flakes[test] = learned.flakes.get(test, 0) + 1
    learned.seconds = {t: statistics.median(runs.values()) for t, runs in per_run.items()}
    return learned
