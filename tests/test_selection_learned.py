"""The learned ranking on a generated history: it must beat the hand weights where they mislead."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from test_selection.git import Repo
from test_selection.learned import FEATURES, History, RankerCache, TooLittleHistory, rank_files
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget
from tests.gitrepo import GitRepo

# each source's changes go with a test file whose name shares nothing with it, while another
# test file is named after it but never changes with it; sources also change alone half the
# time, so plain co-change counts are weak next to the name (what the hand weights trust)
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


def _top_file(repo: GitRepo, sha: str, learn: bool, cache: Path) -> str:
    parent = repo.git("rev-parse", f"{sha}^")
    hidden = {p for p in repo.git("diff", "--name-only", parent, sha).split() if "tests/" in p}
    config = SelectorConfig(budget=Budget("all"), learn=learn, cache_dir=cache)
    plan, _ = select(repo.path, parent, sha, None, config, exclude_paths=hidden)
    best = max(plan.selected, key=lambda p: p.score)
    return best.test.file


@pytest.mark.slow
def test_learning_beats_the_hand_weights_where_names_mislead(tmp_path: Path) -> None:
    repo, made = _history(tmp_path, 90)
    learned_hits = hand_hits = 0
    for sha, source in made[-15:]:
        truth = f"tests/test_check_{PAIRS[source]}.py"
        learned_hits += _top_file(repo, sha, True, tmp_path / "cache") == truth
        hand_hits += _top_file(repo, sha, False, tmp_path / "cache") == truth
    assert learned_hits >= 14, learned_hits
    assert learned_hits > hand_hits, (learned_hits, hand_hits)


def test_the_reason_names_each_features_contribution(tmp_path: Path) -> None:
    repo, made = _history(tmp_path, 60)
    sha, source = made[-1]
    parent = repo.git("rev-parse", f"{sha}^")
    plan, _ = select(
        repo.path,
        parent,
        sha,
        None,
        SelectorConfig(budget=Budget("all"), cache_dir=tmp_path / "cache"),
        exclude_paths={f"tests/test_check_{PAIRS[source]}.py"},
    )
    top = max(plan.selected, key=lambda p: p.score)
    learned = [e for e in top.evidence if e.source == "learned"]
    assert learned and learned[0].reason.startswith("learned score ")
    assert any(name in learned[0].reason for name in FEATURES)
    assert any(note.startswith("learned from ") for note in plan.notes)
    assert {e.source for p in plan.selected for e in p.evidence}.isdisjoint(
        {"co-change", "path-keywords"}  # inside the model now
    )


def test_too_little_history_keeps_the_hand_weights_and_says_so(tmp_path: Path) -> None:
    repo, made = _history(tmp_path, 5)
    sha, _ = made[-1]
    parent = repo.git("rev-parse", f"{sha}^")
    plan, _ = select(repo.path, parent, sha, None, SelectorConfig(cache_dir=tmp_path / "cache"))
    notes = " ".join(plan.notes)
    assert "30 needed to learn): hand weights rank the tests" in notes
    assert any(e.source == "co-change" for p in plan.selected for e in p.evidence)
    with pytest.raises(TooLittleHistory):
        rank_files(
            Repo(repo.path),
            parent,
            {"src/alpha.py"},
            ["tests/test_zeta.py"],
            {},
            lambda p: p.startswith("tests/"),
            tmp_path / "c2",
            "k",
        )


def test_a_corrupt_fit_is_refitted_not_a_crash(tmp_path: Path) -> None:
    repo, made = _history(tmp_path, 50)
    sha, _ = made[-1]
    history = History.read(Repo(repo.path), sha)
    cache = RankerCache(tmp_path / "cache", "key")
    args = (
        Repo(repo.path),
        sha,
        {_source("alpha")},
        [f"tests/test_check_{t}.py" for t in PAIRS.values()],
        {},
        lambda p: p.startswith("tests/"),
        tmp_path / "cache",
        "key",
    )
    first = rank_files(*args)
    assert first is not None and cache.find(history) is not None
    for stored in cache.folder.glob("*.pickle"):
        stored.write_bytes(b"not a pickle")
    again = rank_files(*args)
    assert again is not None and again.scores == pytest.approx(first.scores)
    assert cache.find(history) is not None  # written anew


class _RecordingAgent:
    """An agent of our own protocol that records which tests it was asked to review."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def review(self, change, scored, inventory):  # type: ignore[no-untyped-def]
        from test_selection.agents import Review

        self.seen |= {t.file for t in scored}
        return Review(self.name, [])


def test_the_agent_reviews_only_what_the_learned_ranking_is_unsure_of(tmp_path: Path) -> None:
    repo, made = _history(tmp_path, 90)
    sha, source = made[-1]
    parent = repo.git("rev-parse", f"{sha}^")
    truth = f"tests/test_check_{PAIRS[source]}.py"
    sure, hand = _RecordingAgent(), _RecordingAgent()
    common = {"budget": Budget("all"), "cache_dir": tmp_path / "cache"}
    plan, _ = select(
        repo.path, parent, sha, None, SelectorConfig(agent=sure, **common), exclude_paths={truth}
    )
    select(
        repo.path,
        parent,
        sha,
        None,
        SelectorConfig(agent=hand, learn=False, **common),
        exclude_paths={truth},
    )
    every = {f"tests/test_check_{t}.py" for t in PAIRS.values()} | {
        f"tests/test_{s}_core_loader.py" for s in PAIRS
    }
    assert hand.seen == every  # the hand weights: the agent reviews every candidate
    assert truth not in sure.seen  # the learned ranking is sure of the file history pairs
    assert sure.seen < every
    assert any("whose files the learned ranking is unsure of" in n for n in plan.notes)
