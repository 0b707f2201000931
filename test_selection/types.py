"""Typed values passed between the selector's stages (and stored by the relay)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, order=True)
class TestId:
    """A generic upstream test: ``test/test_x.py::TestX::test_y`` (never instantiated names)."""

    __test__ = False

    file: str
    cls: str | None
    name: str

    @property
    def sort_key(self) -> tuple[str, str, str]:
        """A cheap total order (dataclass comparisons are slow on 60,000 tests)."""
        return (self.file, self.cls or "", self.name)

    @property
    def nodeid(self) -> str:
        return f"{self.file}::{self.cls}::{self.name}" if self.cls else f"{self.file}::{self.name}"

    @classmethod
    def parse(cls, nodeid: str) -> TestId:
        parts = nodeid.split("::")
        if len(parts) == 3:
            return cls(parts[0], parts[1], parts[2])
        if len(parts) == 2:
            return cls(parts[0], None, parts[1])
        raise ValueError(f"not a test id: {nodeid!r} (expected FILE::Class::test or FILE::test)")


@dataclass(frozen=True)
class Evidence:
    """One reason to run (or not run) a test: from the ranking, a signal or an agent."""

    stage: str  # candidates | agent | plan
    source: str  # "ranking", a signal's name, or an agent's
    score: float
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "source": self.source,
            "score": round(self.score, 4),
            "reason": self.reason,
        }


@dataclass
class Scored:
    """A test with everything said about it so far; its score is the sum of the evidence."""

    test: TestId
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def score(self) -> float:
        total = 0.0
        for e in self.evidence:
            total += e.score
        return total

    @property
    def mandatory(self) -> bool:
        """Edited by the change or directly referencing it: no budget or agent may drop it."""
        return any(e.source in MANDATORY_SOURCES and e.score >= 0.5 for e in self.evidence)


MANDATORY_SOURCES = frozenset({"edited-by-change", "references-change", "always-run"})
# evidence that gives a test its place in the plan rather than a score: the coverage floor
# (coverage/floor.py) and safe mode (safe.py); the plan shows their reason first
FLOOR_SOURCE = "coverage-floor"
SAFE_SOURCE = "safe-mode"
SWEEP_SOURCE = "sweep"  # a file most of whose tests reach the change, run whole (sweeps.py)
PLACE_SOURCES = frozenset({FLOOR_SOURCE, SAFE_SOURCE, SWEEP_SOURCE})


_BUDGET = re.compile(r"^\s*(?:(all)|(\d+(?:\.\d+)?)\s*(%|s)?)\s*$")


@dataclass(frozen=True)
class Budget:
    """How much to run: a count of tests, a fraction of the universe, or seconds."""

    kind: str  # all | count | fraction | seconds
    value: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Budget:
        match = _BUDGET.match(text)
        if not match:
            raise ValueError(
                f"bad budget {text!r}: use a count (200), a percentage (15%), seconds (600s) or all"
            )
        if match.group(1):
            return cls("all")
        number, unit = float(match.group(2)), match.group(3)
        if unit == "%":
            if not 0 < number <= 100:
                raise ValueError(f"bad budget {text!r}: a percentage must be in (0, 100]")
            return cls("fraction", number / 100)
        if unit == "s":
            if number <= 0:
                raise ValueError(f"bad budget {text!r}: seconds must be more than 0")
            return cls("seconds", number)
        if number < 1 or not number.is_integer():
            # "0.15" read as a count is a plan of (almost) nothing: say what was likely meant
            meant = f"{number * 100:g}%" if number < 1 else f"{round(number)} tests"
            raise ValueError(
                f"bad budget {text!r}: a count of tests is a whole number of at least 1"
                + (
                    f" (for a share of the tests write a percentage: did you mean {meant}?)"
                    if number > 0
                    else ""
                )
            )
        return cls("count", number)

    def __str__(self) -> str:
        return {
            "all": "all",
            "count": f"{self.value:g} tests",
            "fraction": f"{self.value * 100:g}%",
            "seconds": f"{self.value:g}s",
        }[self.kind]


@dataclass
class PlannedTest:
    test: TestId
    score: float
    reasons: list[str]
    evidence: list[Evidence]
    duration: float
    shard: int | None = None
    mode: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "test": self.test.nodeid,
            "file": self.test.file,
            "score": round(self.score, 4),
            "reasons": self.reasons,
            "evidence": [e.to_json() for e in self.evidence],
            "duration": round(self.duration, 3),
            "shard": self.shard,
            "mode": self.mode,
        }


@dataclass
class TestPlan:
    """The selector's output: what runs, on which shard, and why; what was left out."""

    __test__ = False

    base: str
    head: str
    budget: str
    agent: str
    universe_size: int
    selected: list[PlannedTest]
    excluded: list[PlannedTest]
    shards: list[list[str]]
    change: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage
    patterns: list[str] = field(default_factory=list)  # the test-file globs used
    # what the specs list that this revision lacks (reuse_specs' SpecDrift.to_json): the run
    # goes on without it, and the run page and reports say so
    spec_drift: list[dict[str, Any]] = field(default_factory=list)
    # how test files were ranked: the backtest's choice and its figures (empty: hand weights)
    ranking: dict[str, Any] = field(default_factory=dict)
    # the coverage map used (coverage_select.CoverageUse.to_json; empty: none)
    coverage: dict[str, Any] = field(default_factory=dict)
    mode: str = "ranked"  # or "safe": no budget, every test the change reaches (safe.py)

    def shares(self) -> dict[str, float]:
        """What part of the universe the plan takes: tests, test files, estimated seconds."""
        everything = self.selected + self.excluded
        files = {p.test.file for p in everything}
        seconds = sum(p.duration for p in everything)
        return {
            "tests": round(len(self.selected) / len(everything), 4) if everything else 0.0,
            "test_files": round(len({p.test.file for p in self.selected}) / len(files), 4)
            if files
            else 0.0,
            "seconds": round(sum(p.duration for p in self.selected) / seconds, 4)
            if seconds
            else 0.0,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "head": self.head,
            "budget": self.budget,
            "agent": self.agent,
            "universe_size": self.universe_size,
            "shares": self.shares(),
            "timings": self.timings,
            "patterns": self.patterns,
            "selected": [t.to_json() for t in self.selected],
            "excluded": [t.to_json() for t in self.excluded],
            "shards": self.shards,
            "change": self.change,
            "notes": self.notes,
            "spec_drift": self.spec_drift,
            "ranking": self.ranking,
            "coverage": self.coverage,
            "mode": self.mode,
        }
