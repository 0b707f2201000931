"""The live change runs what the backtest measured: for every candidate of the registry, a
commit selected live takes, file by file, the tests the backtest's replay of that same
commit takes when it spends the budget with the live plan's numbers (its calibration and
fitted models). A real git history with a learned model, a test model and a coverage map
that all fit, so every candidate is exercised."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from test_selection import selector
from test_selection.coverage.map import CoverageMap
from test_selection.git import Repo
from test_selection.ranking import cases as cases_module
from test_selection.ranking import choice as choice_module
from test_selection.ranking.allocation import MODEL
from test_selection.ranking.candidate import REGISTRY, Candidate
from test_selection.ranking.choice import replay_commit
from test_selection.ranking.history import History
from test_selection.ranking.live import ranked_evidence as live_values
from test_selection.ranking.rules import take_best
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget
from tests.gitrepo import GitRepo

MODULES = 24
TRAINING = 36  # pairs before the replayed commits: the learned model's fit
REPLAYED = 16  # the commits each backtest replays


def _module(k: int, n: int = 0) -> str:
    return f"def run(x):\n    return x + {k} * {n + 1}\n\n\ndef spare():\n    return {k}\n"


def _checker(k: int, n: int = 0) -> str:
    """Module k's tests: two that call ``run`` (a change edits them), two that do not."""
    return (
        f"from pkg.mod{k:02d} import run, spare\n\n\n"
        f"def test_run_{k:02d}():\n    assert run(1) == 1 + {k} * {n + 1}\n\n\n"
        f"def test_run_{k:02d}_twice():\n    assert run(2) == 2 + {k} * {n + 1}\n\n\n"
        f"def test_spare_{k:02d}():\n    assert spare() == {k}\n\n\n"
        f"def test_import_{k:02d}():\n    assert callable(run)\n"
    )


def _decoy(k: int) -> str:
    return f"import os\n\n\ndef test_mod{k:02d}():\n    assert os.sep\n"


def _history(tmp_path: Path) -> tuple[GitRepo, str]:
    """Commits that each change one module's ``run`` and edit the two tests calling it;
    returns the repository and the base (where the map is recorded)."""
    repo = GitRepo(tmp_path / "up")
    repo.git("remote", "add", "origin", "https://github.com/example/modules.git")
    files: dict[str, str | bytes | None] = {"pkg/__init__.py": ""}
    for k in range(MODULES):
        files[f"pkg/mod{k:02d}.py"] = _module(k)
        files[f"tests/test_check_{k:02d}.py"] = _checker(k)
        files[f"tests/test_mod{k:02d}.py"] = _decoy(k)
    base = repo.commit("base", files, dedent=False)
    for n in range(1, TRAINING + REPLAYED + 2):
        k = (n * 7) % MODULES
        repo.commit(
            f"change run of module {k}",
            {f"pkg/mod{k:02d}.py": _module(k, n), f"tests/test_check_{k:02d}.py": _checker(k, n)},
            dedent=False,
        )
    return repo, base


def _map(base: str) -> CoverageMap:
    """What the recorder would see: each module's ``run`` executed by its two run tests,
    ``spare`` by its spare test."""
    cmap = CoverageMap("example/modules", base)
    for k in range(MODULES):
        test_file = f"tests/test_check_{k:02d}.py"
        for name, distance in ((f"test_run_{k:02d}", 1), (f"test_run_{k:02d}_twice", 2)):
            cmap.add(f"{test_file}::{name}", {(f"pkg/mod{k:02d}.py", "run"): distance})
        cmap.add(f"{test_file}::test_spare_{k:02d}", {(f"pkg/mod{k:02d}.py", "spare"): 1})
    return cmap


def _watch_live_values(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the selector's live ranking is given and gives (the real function, called
    through): the choice, the tests by file, the inputs, the values. Refilled per selection."""
    seen: dict[str, Any] = {}

    def ranked_evidence(choice, history, change, by_file, inputs, file_weight, similarity):  # type: ignore[no-untyped-def]
        seen.update(choice=choice, by_file=by_file, inputs=inputs)
        seen["values"] = live_values(
            choice, history, change, by_file, inputs, file_weight, similarity
        )
        return seen["values"]

    monkeypatch.setattr(selector, "ranked_evidence", ranked_evidence)
    return seen


def _live_counts(seen: dict[str, Any]) -> dict[str, int]:
    """What the live values take of each file at the backtest's budget (the rule's own
    taking, over the values the plan ranks by)."""
    values = seen["values"]
    per_file = []
    for path, tests in sorted(seen["by_file"].items()):
        found = sorted((values[fn.id].score for fn in tests), reverse=True)
        per_file.append((path, np.array(found)))
    plan = seen["choice"]
    return take_best(per_file, plan.fraction * sum(seen["inputs"].sizes.values()))


def _replaying_every_anchor(monkeypatch: pytest.MonkeyPatch) -> None:
    """An anchor at every commit (the live change's base is its own anchor), the newest
    REPLAYED commits replayed."""
    monkeypatch.setattr(choice_module, "REFIT_EVERY", 1)
    monkeypatch.setattr(cases_module, "BACKTEST_CASES", REPLAYED)


def test_selecting_a_commit_live_takes_what_its_replay_takes_for_every_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _replaying_every_anchor(monkeypatch)
    repo, base = _history(tmp_path)
    index = _map(base).index()
    head = repo.git("rev-parse", "HEAD")
    history = History.read(Repo(repo.path), head)
    anchor = len(history.shas) - 1
    seen = _watch_live_values(monkeypatch)
    checked: list[Candidate] = []
    changed = (TRAINING + REPLAYED + 1) * 7 % MODULES  # the module the newest commit changes
    for candidate in REGISTRY:
        config = SelectorConfig(
            budget=Budget.parse("15%"),
            cache_dir=tmp_path / "cache",
            coverage=index,
            ranking=candidate.key,
            floor=False,
            executed_share=0.0,
            sweeps=False,
        )
        seen.clear()
        hidden = {f"tests/test_check_{changed:02d}.py"}
        select(repo.path, "HEAD~1", "HEAD", None, config, exclude_paths=hidden)
        plan = seen["choice"]
        assert plan.candidate == candidate, (plan.candidate, candidate)
        # each candidate ran as itself: its fitted models, the map's reach of the change
        assert (plan.learned is not None) == candidate.learned
        assert (plan.test_model is not None) == (candidate.rule == MODEL)
        reach = seen["inputs"].reach or {}
        assert sorted(t.name for t in reach) == [
            f"test_run_{changed:02d}",
            f"test_run_{changed:02d}_twice",
        ]
        live = _live_counts(seen)
        replayed = replay_commit(
            Repo(repo.path), history, anchor, seen["inputs"], candidate, head, plan
        )
        assert live == replayed, (candidate.key, live, replayed)
        assert sum(live.values()) == round(plan.fraction * sum(seen["inputs"].sizes.values()))
        checked.append(candidate)
    assert checked == list(REGISTRY)


def test_replaying_a_commit_the_backtest_does_not_replay_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _replaying_every_anchor(monkeypatch)
    repo, base = _history(tmp_path)
    seen = _watch_live_values(monkeypatch)
    config = SelectorConfig(cache_dir=tmp_path / "cache", ranking="history/spread")
    select(repo.path, "HEAD~1", "HEAD", None, config)
    history = History.read(Repo(repo.path), "HEAD")
    anchor = len(history.shas) - 1
    plan, inputs = seen["choice"], seen["inputs"]
    with pytest.raises(ValueError, match="is not among the commits replayed"):
        replay_commit(Repo(repo.path), history, anchor, inputs, plan.candidate, base, plan)
    # a candidate that reads the map, with no map given
    mapped = Candidate("history", "spread", "reached-first")
    head = repo.git("rev-parse", "HEAD")
    with pytest.raises(ValueError, match="cannot be replayed with these inputs"):
        replay_commit(Repo(repo.path), history, anchor, inputs, mapped, head, plan)
    # an unknown candidate on trial is refused before any work, in the library as in the CLI
    with pytest.raises(ValueError, match="unknown candidate"):
        select(repo.path, "HEAD~1", "HEAD", None, replace(config, trial=("history/slow",)))
