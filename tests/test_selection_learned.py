"""The learned ranking on a generated history: right where the names mislead, and saying why."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from test_selection.git import Repo
from test_selection.ranking.history import History
from test_selection.ranking.learned import FEATURES, fit
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget
from tests.gitrepo import GitRepo

# each source's changes go with a test file whose name shares nothing with it, while another
# test file is named after it but never changes with it; sources also change alone half the
# time, so plain co-change counts are weak next to the name (what the path words trust)
PAIRS = {"alpha": "one", "beta": "two", "gamma": "three", "delta": "four"}


def _source(name: str) -> str:
    return f"src/{name}_core_loader.py"


def _history(tmp_path: Path, commits: int) -> tuple[GitRepo, list[tuple[str, str]]]:
    repo = GitRepo(tmp_path / "up")
    files = {_source(s): f"def run_{s}():\n    return 0\n" for s in PAIRS}
    files |= {
        f"tests/test_check_{t}.py": f"def test_{t}():\n    assert True\n" for t in PAIRS.values()
    }
    files |= {  # named after the sources, never changed with them
        f"tests/test_{s}_core_loader.py": f"def test_{s}_named():\n    assert True\n" for s in PAIRS
    }
    repo.commit("base", files)
    rng = random.Random(7)
    made: list[tuple[str, str]] = []
    for n in range(commits):
        source = rng.choice(sorted(PAIRS))
        change = {_source(source): f"def run_{source}():\n    return {n}\n"}
        if n < commits - 15 and rng.random() < 0.5:
            repo.commit(f"change {source} alone ({n})", change)
            continue
        test = f"tests/test_check_{PAIRS[source]}.py"
        change[test] = f"def test_{PAIRS[source]}():\n    assert {n} == {n}\n"
        made.append((repo.commit(f"change {source} ({n})", change), source))
    return repo, made


def _top_file(repo: GitRepo, sha: str, ranking: str, cache: Path) -> str:
    parent = repo.git("rev-parse", f"{sha}^")
    hidden = {p for p in repo.git("diff", "--name-only", parent, sha).split() if "tests/" in p}
    config = SelectorConfig(budget=Budget("all"), ranking=ranking, cache_dir=cache)
    plan, _ = select(repo.path, parent, sha, None, config, exclude_paths=hidden)
    best = max(plan.selected, key=lambda p: p.score)
    return best.test.file


@pytest.mark.slow
def test_neither_the_learned_nor_the_prior_ranking_is_misled_by_names(tmp_path: Path) -> None:
    """Where names point at the wrong file (what the retired hand weights trusted), both
    the learned ranking and history counting on prior numbers find the right one."""
    repo, made = _history(tmp_path, 90)
    learned_hits = prior_hits = 0
    for sha, source in made[-15:]:
        truth = f"tests/test_check_{PAIRS[source]}.py"
        learned_hits += _top_file(repo, sha, "auto", tmp_path / "cache") == truth
        prior_hits += _top_file(repo, sha, "prior", tmp_path / "cache") == truth
    assert learned_hits >= 14, learned_hits
    assert prior_hits >= 14, prior_hits


def test_the_reason_names_each_features_contribution(tmp_path: Path) -> None:
    repo, made = _history(tmp_path, 60)
    sha, source = made[-1]
    parent = repo.git("rev-parse", f"{sha}^")
    plan, _ = select(
        repo.path,
        parent,
        sha,
        None,
        SelectorConfig(budget=Budget("all"), cache_dir=tmp_path / "cache", ranking="learned"),
        exclude_paths={f"tests/test_check_{PAIRS[source]}.py"},
    )
    assert plan.ranking["chosen"] == "learned"
    top = max(plan.selected, key=lambda p: p.score)
    ranking = [e for e in top.evidence if e.source == "ranking"]
    assert ranking and "by learned model" in ranking[0].reason
    assert "(learned score " in ranking[0].reason
    assert any(name in ranking[0].reason for name in FEATURES)
    # the ranking and the signals beside it (candidates.py), nothing else
    said = {e.source for p in plan.selected for e in p.evidence if e.stage == "candidates"}
    assert said <= {
        "ranking",
        "edited-by-change",
        "failure-history",
        "always-run",
    }


def test_too_little_to_learn_from_is_said(tmp_path: Path) -> None:
    repo, made = _history(tmp_path, 5)
    history = History.read(Repo(repo.path), made[-1][0])
    ranker, why = fit(
        history,
        [f"tests/test_check_{t}.py" for t in PAIRS.values()],
        {},
        lambda p: p.startswith("tests/"),
    )
    assert ranker is None
    assert "needed to learn" in why


class _RecordingAgent:
    """An agent of our own protocol that records which tests it was asked to review."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def review(self, change, scored, inventory):  # type: ignore[no-untyped-def]
        from test_selection.agents import Review

        self.seen |= {t.file for t in scored}
        return Review(self.name, [])


def test_an_agent_under_the_backtest_ranking_moves_a_test_by_at_most_its_value(
    tmp_path: Path,
) -> None:
    """A non-local agent still reviews under the backtest ranking, in the ranking's units."""
    repo, made = _history(tmp_path, 90)
    sha, source = made[-1]
    parent = repo.git("rev-parse", f"{sha}^")
    truth = f"tests/test_check_{PAIRS[source]}.py"
    agent = _RecordingAgent()
    common = {"budget": Budget("all"), "cache_dir": tmp_path / "cache"}
    plan, _ = select(
        repo.path, parent, sha, None, SelectorConfig(agent=agent, **common), exclude_paths={truth}
    )
    assert plan.ranking and agent.seen  # it was asked
    prior = _RecordingAgent()
    select(
        repo.path,
        parent,
        sha,
        None,
        SelectorConfig(agent=prior, ranking="prior", **common),
        exclude_paths={truth},
    )
    assert prior.seen
