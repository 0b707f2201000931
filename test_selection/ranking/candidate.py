"""A ranking candidate as one value, and the list of them the backtest replays.

A candidate is three choices: which ranker orders the test files (``rankers.py``), which
budget rule spends the budget over their tests (``rules.py``), and how a coverage map is
used (not at all, the tests it reaches first in their files, or those files moved up too).
The backtest (``choice.py``) replays every candidate of :data:`REGISTRY` that this change's
inputs allow, in the registry's order (a tie goes to the earlier one), and the plan applies
the winner. A candidate *on trial* is replayed and reported beside the others but never
chosen: a new ranker or rule shows what it would do before it may decide anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from test_selection.ranking.allocation import MODEL, REACHED_FILES, REACHED_FIRST, SPREAD, WHOLE

# the rankers, in the order a tie goes to; three need the learned model's fit
RANKERS = ("history", "learned", "blend", "history+words", "learned+words")
LEARNED = frozenset({"learned", "blend", "learned+words"})
RULES = (WHOLE, SPREAD, MODEL)
MAP_USES = ("", REACHED_FIRST, REACHED_FILES)

_MAP_LABELS = {
    "": "",
    REACHED_FIRST: ", tests the coverage map reaches first",
    REACHED_FILES: ", files and tests the coverage map reaches first",
}
_MODEL_MAP_LABELS = {
    "": "",
    REACHED_FIRST: " reading the coverage map",
    REACHED_FILES: " reading the coverage map, files it reaches first",
}


@dataclass(frozen=True)
class Candidate:
    """One way to rank: a ranker, a budget rule, a use of the coverage map; with sweeps
    (files most of whose tests use a changed def, run whole first) as the backtest's last
    variant of its winner, and ``trial`` for a candidate measured but never chosen."""

    ranker: str
    rule: str = SPREAD
    map_use: str = ""
    sweeps: bool = False
    trial: bool = False

    def __post_init__(self) -> None:
        for value, allowed, what in (
            (self.ranker, RANKERS, "ranker"),
            (self.rule, RULES, "budget rule"),
            (self.map_use, MAP_USES, "coverage map use"),
        ):
            if value not in allowed:
                shown = ", ".join(repr(a) for a in allowed)
                raise ValueError(f"unknown {what} {value!r} (one of {shown})")

    @property
    def key(self) -> str:
        """``ranker/rule``, then ``/map use`` and ``/sweeps`` where they apply: how the
        backtest's figures and ``--trial`` name it."""
        parts = [self.ranker, self.rule, self.map_use, "sweeps" if self.sweeps else ""]
        return "/".join(p for p in parts if p)

    @property
    def learned(self) -> bool:
        """It needs the learned model's fit."""
        return self.ranker in LEARNED

    def label(self, description: str) -> str:
        """How a plan names it, given its ranker's description."""
        swept = ", sweeps run whole" if self.sweeps else ""
        if self.rule == MODEL:
            return f"{description}, tests by the test model{_MODEL_MAP_LABELS[self.map_use]}{swept}"
        whole = ", whole files" if self.rule == WHOLE else ""
        return f"{description}{whole}{_MAP_LABELS[self.map_use]}{swept}"

    def swept(self) -> Candidate:
        return replace(self, sweeps=True)


def _registry() -> tuple[Candidate, ...]:
    """Every candidate in the order the backtest measures them (ties go to the earlier):
    without the map whole files, then spread, then the test model; with it, the same
    rules for each use of the map."""
    plain = [Candidate(r, rule) for rule in (WHOLE, SPREAD, MODEL) for r in RANKERS]
    mapped = [
        Candidate(r, rule, use)
        for use in (REACHED_FIRST, REACHED_FILES)
        for rule in (WHOLE, SPREAD)
        for r in RANKERS
    ]
    model = [Candidate(r, MODEL, use) for use in (REACHED_FIRST, REACHED_FILES) for r in RANKERS]
    return (*plain, *mapped, *model)


REGISTRY: tuple[Candidate, ...] = _registry()
BASELINE = REGISTRY[0]  # history counting, whole files, no map: the plain reference
# where nothing was measured (``choice.prior_choice``): history counting spread over the
# files by prior numbers, each file's tests in the change's words order, with the tests that
# name a changed op or function first (``candidates.prior_signals``); bench/README.md, "The
# prior ranking", has the variants measured
PRIOR = Candidate("history", SPREAD)
KEYS = frozenset(c.key for c in REGISTRY)


def on_trial(keys: frozenset[str] | tuple[str, ...]) -> tuple[Candidate, ...]:
    """The registry with the candidates named by ``keys`` on trial. The baseline cannot be:
    every other candidate is judged against it."""
    unknown = sorted(set(keys) - KEYS)
    if unknown:
        raise ValueError(
            f"unknown candidate(s) {', '.join(unknown)}: a candidate is ranker/rule/map use, "
            f"e.g. {REGISTRY[5].key} or {REGISTRY[-1].key}"
        )
    if BASELINE.key in keys:
        raise ValueError(f"{BASELINE.key} is the baseline every candidate is judged by")
    return tuple(replace(c, trial=True) if c.key in keys else c for c in REGISTRY)
