"""What one candidate ranking found on the backtest, and how the plan names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from test_selection.ranking.allocation import MODEL, REACHED_FILES, REACHED_FIRST, SPREAD, WHOLE

COVERAGE_LABELS = {
    "": "",
    REACHED_FIRST: ", tests the coverage map reaches first",
    REACHED_FILES: ", files and tests the coverage map reaches first",
}

MODEL_COVERAGE_LABELS = {
    "": "",
    REACHED_FIRST: " reading the coverage map",
    REACHED_FILES: " reading the coverage map, files it reaches first",
}


@dataclass(frozen=True)
class Figures:
    """What one candidate ranking found on the backtest."""

    name: str
    description: str
    file_recall: float
    test_recall: float
    allocation: str = SPREAD
    coverage: str = ""  # "", REACHED_FIRST or REACHED_FILES: how the coverage map is used
    sweeps: bool = False  # files most of whose tests use a changed def run whole first

    @property
    def objective(self) -> float:
        return self.file_recall + self.test_recall

    @property
    def label(self) -> str:
        swept = ", sweeps run whole" if self.sweeps else ""
        if self.allocation == MODEL:
            return (
                self.description
                + ", tests by the test model"
                + MODEL_COVERAGE_LABELS[self.coverage]
                + swept
            )
        return (
            self.description
            + (", whole files" if self.allocation == WHOLE else "")
            + COVERAGE_LABELS[self.coverage]
            + swept
        )

    @property
    def key(self) -> str:
        return f"{self.name}/{self.allocation}/{self.coverage}" + ("/sweeps" if self.sweeps else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "ranking": self.name,
            "allocation": self.allocation,
            "coverage": self.coverage,
            "description": self.label,
            "file_recall": round(self.file_recall, 4),
            "edited_test_recall": round(self.test_recall, 4),
            "sweeps": self.sweeps,
        }
