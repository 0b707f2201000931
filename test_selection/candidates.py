"""Stage 2, candidate tests: the per-test signals beside the ranking, one small class each.

The ranking (``ranking/``) gives every test its value from the repository's own history;
these say what no history can: the change edits the test, the test failed lately, the
operator always runs it; and, where no backtest measured the ranking (``prior_signals``),
the test names what the change alters. Scores are in [-1, 1] and summed per test, like
PyTorch's target determination; unlike it, they are per test function and every score
carries its reason.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Protocol

from test_selection.change_analysis import ChangeAnalysis
from test_selection.inventory import Inventory, TestFunction
from test_selection.types import Evidence, TestId

STAGE = "candidates"


@dataclass
class Context:
    """What the signals may look at besides the change and the inventory."""

    universe: set[TestId]
    failure_history: Mapping[TestId, int] = field(default_factory=dict)
    always_run: tuple[str, ...] = ()
    flake_history: Mapping[TestId, int] = field(default_factory=dict)


class Signal(Protocol):
    """Evidence on tests of the change: (test, why) pairs, any number per test."""

    @property
    def name(self) -> str: ...

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]: ...


def _ev(source: str, score: float, reason: str) -> Evidence:
    clamped = -1.0 if score < -1.0 else 1.0 if score > 1.0 else score
    return Evidence(STAGE, source, clamped, reason)


class EditedByChange:
    """The change adds or edits the test itself (1.0), or edits its test file (0.3)."""

    name = "edited-by-change"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        touched = change.tests_added | change.tests_modified
        for test in touched:
            verb = "adds" if test in change.tests_added else "edits"
            yield test, _ev(self.name, 1.0, f"the change {verb} this test")
        edited_files = {f.path for f in change.files if f.path in inventory.files}
        for path in edited_files:
            file = inventory.files.get(path)
            for fn in file.tests if file else []:
                if fn.id not in touched:
                    yield fn.id, _ev(self.name, 0.3, f"the change edits its file {path}")


class ReferencesChange:
    """The test names a changed operator (0.9) or a changed function or class (0.6).

    Weighted by rarity: a name used by half the suite says little about any one test.
    """

    name = "references-change"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        tests = inventory.tests()
        if not tests or not (change.ops or change.names):
            return
        doc_freq = inventory.reference_counts
        total = len(tests)

        def rarity(name: str) -> float:
            df = doc_freq.get(name, 0)
            return 1.0 if df <= 1 else max(0.2, 1 - math.log(df) / math.log(max(total, 3)))

        source_names = {n for n in change.names if not n.startswith("test")}
        for fn in tests:
            refs = set(fn.references)
            ops = sorted(change.ops & refs)
            names = sorted((source_names - change.ops) & refs)
            if ops:
                best = max(ops, key=rarity)
                yield (
                    fn.id,
                    _ev(self.name, 0.9 * rarity(best), f"uses changed op {', '.join(ops[:3])}"),
                )
            elif names:
                best = max(names, key=rarity)
                yield (
                    fn.id,
                    _ev(self.name, 0.6 * rarity(best), f"uses changed {', '.join(names[:3])}"),
                )


class FailureHistory:
    """Tests that failed recently in the relay's own results (flaky ones count less: a
    failure that passes on rerun says less about the change)."""

    name = "failure-history"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        for test in set(ctx.failure_history) | set(ctx.flake_history):
            failures = ctx.failure_history.get(test, 0)
            flakes = ctx.flake_history.get(test, 0)
            if failures > 0:
                yield (
                    test,
                    _ev(
                        self.name,
                        0.5 * min(1.0, failures / 3),
                        f"failed {failures} time(s) recently",
                    ),
                )
            elif flakes > 0:
                yield test, _ev(self.name, 0.1, f"flaky {flakes} time(s) recently")


class AlwaysRun:
    """Tests the operator always runs (globs over node ids)."""

    name = "always-run"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        if not ctx.always_run:
            return
        for fn in inventory.tests():
            pattern = next((p for p in ctx.always_run if fnmatchcase(fn.id.nodeid, p)), None)
            if pattern:
                yield fn.id, _ev(self.name, 1.0, f"always run ({pattern})")


@dataclass(frozen=True)
class RankingValues:
    """The chosen ranking's value of each universe test (``ranking/live.py``), as a signal:
    the candidates stage reads the ranking as it reads the others."""

    values: Mapping[TestId, Evidence]
    name: str = "ranking"

    def evidence(
        self, change: ChangeAnalysis, inventory: Inventory, ctx: Context
    ) -> Iterable[tuple[TestId, Evidence]]:
        return self.values.items()


def default_signals() -> list[Signal]:
    return [EditedByChange(), FailureHistory(), AlwaysRun()]


def prior_signals() -> list[Signal]:
    """Where the ranking runs on prior numbers (too little history to replay): the tests
    that name a changed op or function too. The backtest never measured this signal, so a
    measured ranking goes without it; on 20-commit histories it keeps what the rankers'
    words miss (bench/README.md, "The prior ranking")."""
    return [*default_signals(), ReferencesChange()]


def collect_evidence(
    change: ChangeAnalysis,
    inventory: Inventory,
    ctx: Context,
    signals: list[Signal] | None = None,
) -> dict[TestId, list[Evidence]]:
    """Evidence per test in the universe; one item per signal (its strongest)."""
    best: dict[tuple[TestId, str], Evidence] = {}
    for signal in default_signals() if signals is None else signals:
        for test, ev in signal.evidence(change, inventory, ctx):
            if test not in ctx.universe:
                continue
            key = (test, signal.name)
            if key not in best or ev.score > best[key].score:
                best[key] = ev
    out: dict[TestId, list[Evidence]] = defaultdict(list)
    for (test, _), ev in best.items():
        out[test].append(ev)
    return dict(out)


def tests_of(inventory: Inventory) -> dict[TestId, TestFunction]:
    return inventory.by_id()
