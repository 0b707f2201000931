"""What each candidate's replay is given besides its ranker's file orders, made once and
shared: the cases as a use of the map sees them, the test model's replays, the files it reads.

The backtest (``choice.py``) asks for a candidate's setting; the costly parts (the map's
reach per case, the test model's out-of-fold replay) are made the first time a candidate
needs them and serve every ranker after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from test_selection.coverage.select import PastReach
from test_selection.ranking.allocation import MODEL, REACHED_FILES, Calibration
from test_selection.ranking.candidate import Candidate
from test_selection.ranking.cases import Case, replay_case, with_reach
from test_selection.ranking.model_replay import ModelReplay, files_to_read, replay_model
from test_selection.ranking.replay import shared_calibration
from test_selection.ranking.test_model import TestModel, TestText


class Measured(Protocol):
    """The backtest under way, as a setting reads it (and where it keeps the fitted test
    models, by use of the map)."""

    cases: list[Case]
    sizes: Mapping[str, int]
    fraction: float
    models: dict[str, TestModel]


# per case: the candidate's file order and each file's rank bucket
Ranked = list[tuple[list[str], dict[str, int]]]


@dataclass
class Replays:
    """Every ranker's file order on every case, as ranked and with the files the map
    reaches moved up (``boosted``, only with a map)."""

    names: list[str]
    descriptions: dict[str, str]
    plain: dict[str, Ranked]
    boosted: dict[str, Ranked]


@dataclass
class Setting:
    """What a candidate's replay is given besides its ranker's file orders: the cases as
    its use of the map sees them, their shared numbers, the tests the map puts first per
    case, and the test model's replay (MODEL rule)."""

    orders: dict[str, Ranked]
    cases: Sequence[Case]
    shared: Calibration
    reached: Sequence[Mapping[str, int]] | None = None
    replay: ModelReplay | None = None


class Settings:
    """Each candidate's setting (``Setting``), made the first time a candidate needs it:
    the test model's replays and the map's reach per case cost the most, and are shared by
    every ranker. None where the inputs do not allow the candidate (no map, no test texts,
    a test model that could not be fitted)."""

    def __init__(
        self,
        backtest: Measured,
        replays: Replays,
        reach: PastReach,
        texts: Mapping[str, Sequence[TestText]] | None,
        has_map: bool,
        model: TestModel | None = None,
    ) -> None:
        self.backtest = backtest
        self.model = model  # a live plan's test model, replayed as it is (``replay_commit``)
        self.replays = replays
        self.reach = reach
        self.texts = texts
        self.has_map = has_map
        self._made: dict[tuple[bool, str], Setting | None] = {}
        self._read: list[set[str]] | None = None
        self._shared: Calibration | None = None

    def get(self, candidate: Candidate) -> Setting | None:
        key = (candidate.rule == MODEL, candidate.map_use)
        if key not in self._made:
            self._made[key] = self._make(*key)
        return self._made[key]

    def _make(self, model: bool, use: str) -> Setting | None:
        if use and not self.has_map:
            return None
        backtest, replays = self.backtest, self.replays
        orders = replays.boosted if use == REACHED_FILES else replays.plain
        cases = backtest.cases
        if model:
            replay = self._model_replay(use)
            if replay is None:
                return None
            return Setting(orders, cases, self._plain_shared(), replay=replay)
        if not use:
            return Setting(orders, cases, self._plain_shared())
        pairs = [with_reach(case, self.reach.get(case.sha, {})) for case in cases]
        reached_cases = [case for case, _counts in pairs]
        counts = [counts for _case, counts in pairs]
        return Setting(
            orders, reached_cases, shared_calibration(reached_cases, counts), reached=counts
        )

    def _plain_shared(self) -> Calibration:
        if self._shared is None:
            self._shared = shared_calibration(self.backtest.cases)
        return self._shared

    def _model_replay(self, use: str) -> ModelReplay | None:
        """The test model replayed out of fold under every ranker's file order (reading
        the map, with one); both replays read the same files per case."""
        if self.texts is None:
            return None
        backtest, replays = self.backtest, self.replays
        if self._read is None and self.model is not None:  # as a live plan reads: all
            self._read = [set(backtest.sizes) for _case in backtest.cases]
        if self._read is None:
            total = sum(backtest.sizes.values())
            self._read = [
                files_to_read(
                    [
                        orders[name][k][0]
                        for name in replays.names
                        for orders in (replays.plain, replays.boosted)
                        if orders[name]
                    ],
                    backtest.sizes,
                    backtest.fraction * total,
                )
                for k in range(len(backtest.cases))
            ]
        reach = self.reach if use else {}
        cases = [replay_case(c, reach.get(c.sha, {}) if use else None) for c in backtest.cases]
        replay = replay_model(cases, self.texts, self._read, bool(use), self.model)
        if replay is None or replay.model is None:
            return None
        backtest.models[use] = replay.model
        return replay
