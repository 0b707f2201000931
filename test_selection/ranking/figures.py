"""What one candidate ranking found on the backtest, and how the plan names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from test_selection.ranking.candidate import Candidate


@dataclass(frozen=True)
class Figures:
    """What one candidate found on the backtest (``description``: its ranker's)."""

    candidate: Candidate
    description: str
    file_recall: float
    test_recall: float

    @property
    def objective(self) -> float:
        return self.file_recall + self.test_recall

    @property
    def label(self) -> str:
        return self.candidate.label(self.description)

    @property
    def key(self) -> str:
        return self.candidate.key

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "ranking": c.ranker,
            "allocation": c.rule,
            "coverage": c.map_use,
            "description": self.label,
            "file_recall": round(self.file_recall, 4),
            "edited_test_recall": round(self.test_recall, 4),
            "sweeps": c.sweeps,
            "trial": c.trial,
        }
