"""The options of ``bench/bench_mutation.py`` (what its command line sets), in a module of
their own so the bench's parts (``mutation_baseline.py``, ``mutation_select.py``) read them
without importing the bench."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from test_selection.coverage.floor import EXECUTED_SHARE

BUDGETS = (0.05, 0.15)


@dataclass
class Options:
    repo: Path
    python: str = sys.executable
    installed: str | None = None  # a package the tests import installed (torch)
    count: int = 10
    seed: int = 0
    timeout: float = 300.0
    test_timeout: float = 60.0
    budgets: tuple[float, ...] = BUDGETS
    coverage: Path | None = None
    scope: str = "reached"  # the reached files; "tests": only the reached tests; "all"
    tests: list[str] = field(default_factory=list)  # test paths (scope all / no map)
    specs: list[Path] = field(default_factory=list)
    backend: str = "cpu"
    agent: str = "none"
    yardstick: Path | None = None
    base: str = "HEAD"
    pytest_args: list[str] = field(default_factory=list)
    targets: list[tuple[str, str, str]] = field(default_factory=list)  # file, qualname, op
    cache_dir: Path | None = None
    preload: list[str] = field(default_factory=list)  # modules the fork server imports
    baseline: Path | None = None  # unmutated outcomes kept per file
    json: Path | None = None
    under: list[str] = field(default_factory=list)  # draw only functions of these paths
    executed_share: float = EXECUTED_SHARE  # selector+map's (SelectorConfig.executed_share)
