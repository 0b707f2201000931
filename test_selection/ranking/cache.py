"""Backtest results kept on disk, so neighbouring changes share one replay.

Per repository, anchor, budget and file weight one pickled :class:`RankingChoice`; per
repository and anchor the agent's verdict. Written atomically; a file that cannot be read
back (another format, a torn write) is removed and rebuilt, with a warning.
"""

from __future__ import annotations

import hashlib
import pickle
import uuid
from pathlib import Path
from typing import Any

from test_selection.ranking.agent_check import AgentVerdict
from test_selection.ranking.choice import RankingChoice

FORMAT = 6  # 2: the test model; 3: the classes moved to test_selection.ranking; 4: sweeps;
# 5: a choice holds a Candidate; 6: the prior ranking replaced the hand weights


class ChoiceCache:
    """Backtest results on disk, per repository, anchor, budget and setting; and the agent's
    verdict, per repository (it is the slow part, and changes slowly)."""

    def __init__(self, root: Path, key: str) -> None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        self.folder = root / f"backtest-v{FORMAT}" / digest

    def _path(self, anchor: str, fraction: float, file_weight: float) -> Path:
        return self.folder / f"{anchor}-{fraction:.4f}-{file_weight:.3f}.pickle"

    def _read(self, path: Path, kind: type) -> tuple[Any, str | None]:
        """The object stored at ``path`` if it is a ``kind``; else None, and a warning when
        something unreadable was there (it is removed, to be rebuilt)."""
        if not path.is_file():
            return None, None
        try:
            with path.open("rb") as handle:
                found = pickle.load(handle)  # our own file, written by _write
        except (
            OSError,
            pickle.UnpicklingError,
            EOFError,
            AttributeError,
            ValueError,
            TypeError,
            ImportError,
        ):
            found = None
        if isinstance(found, kind):
            return found, None
        path.unlink(missing_ok=True)
        return None, f"the cached backtest {path.name} was unreadable: rebuilt"

    def _write(self, path: Path, value: object) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
        with tmp.open("wb") as handle:
            pickle.dump(value, handle)
        tmp.replace(path)  # atomic: a concurrent reader never sees half a file

    def load(
        self, anchor: str, fraction: float, file_weight: float
    ) -> tuple[RankingChoice | None, str | None]:
        """The stored choice, or None; and a warning when a stored one was unreadable."""
        found, warning = self._read(self._path(anchor, fraction, file_weight), RankingChoice)
        return found, warning

    def store(self, choice: RankingChoice, file_weight: float) -> None:
        self._write(self._path(choice.anchor, choice.fraction, file_weight), choice)

    def load_agent(self, name: str, anchor: str) -> tuple[AgentVerdict | None, str | None]:
        """The agent's verdict measured at ``anchor``, or None."""
        found, warning = self._read(self.folder / f"agent-{name}-{anchor}.pickle", AgentVerdict)
        return found, warning

    def store_agent(self, anchor: str, verdict: AgentVerdict) -> None:
        self._write(self.folder / f"agent-{verdict.agent}-{anchor}.pickle", verdict)
