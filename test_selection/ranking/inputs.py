"""What the rankings read of a selection's universe, built once and passed as one value.

The backtest (``choice.py``) replays every candidate ranking over these; the selector then
ranks the live change with the winner over the same ones. The coverage map enters here and
nowhere else: ``map`` carries the index the backtest replays past commits with and the
reach of the live change's functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from test_selection.coverage.map import CoverageIndex, Reach
from test_selection.coverage.select import CoverageUse
from test_selection.ranking.test_model import TestText
from test_selection.types import TestId


@dataclass(frozen=True)
class RankingInputs:
    """Per test file of the universe: how many tests, what it imports, its tests' tokens
    and texts; which paths are tests; and the coverage map's part, if a map is used."""

    sizes: Mapping[str, int]
    imports: dict[str, set[str]]
    is_test: Callable[[str], bool]
    tokens: Mapping[str, Sequence[frozenset[str]]]
    texts: Mapping[str, Sequence[TestText]] | None = None  # None: no test model replayed
    map: CoverageUse | None = None

    @property
    def coverage(self) -> CoverageIndex | None:
        """The map the backtest replays past commits with."""
        return self.map.index if self.map is not None else None

    @property
    def reach(self) -> Mapping[TestId, Reach] | None:
        """What the live change's functions reach, by test."""
        return self.map.reach if self.map is not None else None
