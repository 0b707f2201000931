"""The ranking is chosen by replaying the repository's own history: generated histories
where each candidate is the right one, and the inputs that must not break the choice."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from test_selection.agents import LocalAgent
from test_selection.git import Repo
from test_selection.inventory import is_test_path
from test_selection.ranking import agent_check, backtest, choice
from test_selection.ranking.allocation import Calibration
from test_selection.ranking.cache import ChoiceCache
from test_selection.ranking.candidate import (
    BASELINE,
    LEARNED,
    PRIOR,
    REGISTRY,
    Candidate,
    on_trial,
)
from test_selection.ranking.cases import build_cases
from test_selection.ranking.choice import MIN_CASES
from test_selection.ranking.history import History
from test_selection.selector import SelectorConfig, select
from test_selection.test_bodies import edited_tests, split_tests
from test_selection.types import Budget
from tests.gitrepo import GitRepo

PAIRS = 150  # modules, each with the test that imports it and a decoy named after it
TRAINING = 50  # first-time pairs before the regime the backtest replays


def _module(k: int) -> str:
    return f"pkg/mod{k:03d}.py"


def _checker(k: int) -> str:
    """The test that imports module k (its name shares nothing with the module's)."""
    return f"tests/test_check_{k:03d}.py"


def _decoy(k: int) -> str:
    """A test named after module k that never imports it nor changes with it."""
    return f"tests/test_mod{k:03d}.py"


def _test_file(name: str, imports: str, n: int) -> str:
    return f"{imports}\n\ndef test_{name}():\n    assert {n} == {n}\n\n\ndef test_{name}_more():\n    assert True\n"


def _generate(tmp_path: Path, regime: str) -> tuple[GitRepo, int]:
    """A history whose first TRAINING commits pair a module with the test importing it;
    then either more first-time pairs ("imports": only a learned model that took in the
    import relation finds them) or a few modules changing again and again with a test that
    does not import them ("repeats": co-change counts find them, the imports mislead).
    Returns the repository and the module the last commit changes."""
    repo = GitRepo(tmp_path / regime)
    files: dict[str, str | bytes | None] = {"pkg/__init__.py": ""}
    for k in range(PAIRS):
        files[_module(k)] = f"def run():\n    return {k}\n"
        files[_checker(k)] = _test_file(f"check_{k:03d}", f"from pkg.mod{k:03d} import run", 0)
        files[_decoy(k)] = _test_file(f"mod{k:03d}", "import os", 0)
    repo.commit("base", files, dedent=False)
    for n in range(1, TRAINING + 1):
        repo.commit(
            f"pair {n}",
            {
                _module(n): f"def run():\n    return {n} + 1\n",
                _checker(n): _test_file(f"check_{n:03d}", f"from pkg.mod{n:03d} import run", n),
            },
            dedent=False,
        )
    last = 0
    for n in range(TRAINING + 1, TRAINING + 71):
        if regime == "imports":
            k, partner = n, _checker(n)
        else:  # ten modules, each always with the decoy of the next one
            k = 100 + n % 10
            partner = _decoy(100 + (n + 1) % 10)
        name = partner.rsplit("/", 1)[-1].removeprefix("test_").removesuffix(".py")
        imports = f"from pkg.mod{k:03d} import run" if partner == _checker(k) else "import os"
        repo.commit(
            f"change {k}",
            {
                _module(k): f"def run():\n    return {n} * 2\n",
                partner: _test_file(name, imports, n),
            },
            dedent=False,
        )
        last = k
    return repo, last


def _select_hiding_tests(repo: GitRepo, config: SelectorConfig):  # type: ignore[no-untyped-def]
    """Select for the newest commit with its test edits hidden (as the yardstick does)."""
    parent = repo.git("rev-parse", "HEAD^")
    hidden = {p for p in repo.git("diff", "--name-only", parent, "HEAD").split() if "tests/" in p}
    plan, _ = select(repo.path, parent, "HEAD", None, config, exclude_paths=hidden)
    return plan, hidden


@pytest.mark.parametrize(("regime", "winner"), [("imports", "learned"), ("repeats", "history")])
def test_select_uses_the_ranking_that_wins_on_the_repositorys_own_history(
    tmp_path: Path, regime: str, winner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the anchor is the base itself, so the backtest replays exactly the newest 60 commits
    monkeypatch.setattr(choice, "REFIT_EVERY", 1)
    repo, _module_changed = _generate(tmp_path, regime)
    config = SelectorConfig(budget=Budget.parse("2%"), cache_dir=tmp_path / "cache")
    plan, hidden = _select_hiding_tests(repo, config)
    ranking = plan.ranking
    assert ranking["chosen"] == winner, ranking
    figures = {c["ranking"]: c for c in ranking["candidates"]}
    assert set(figures) == {"history", "learned", "blend", "history+words", "learned+words"}
    best = figures[winner]["file_recall"] + figures[winner]["edited_test_recall"]
    assert all(best >= c["file_recall"] + c["edited_test_recall"] for c in figures.values()), (
        figures
    )
    assert ranking["backtest_commits"] >= MIN_CASES
    assert any(n.startswith("ranking: ") and "chosen by backtest" in n for n in plan.notes)
    # the winner finds the hidden test file within a 2 % budget
    assert hidden <= {p.test.file for p in plan.selected}, (hidden, plan.notes)
    top = max(plan.selected, key=lambda p: p.score)
    assert top.test.file in hidden
    assert any(e.source == "ranking" for e in top.evidence)
    # the JSON says the same
    assert plan.to_json()["ranking"]["chosen"] == winner


def test_a_candidate_on_trial_is_measured_and_reported_but_never_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the history where the learned model wins (above), with every learned candidate on trial
    monkeypatch.setattr(choice, "REFIT_EVERY", 1)
    repo, _module_changed = _generate(tmp_path, "imports")
    trial = tuple(c.key for c in REGISTRY if c.learned)
    config = SelectorConfig(budget=Budget.parse("2%"), cache_dir=tmp_path / "cache", trial=trial)
    plan, _hidden = _select_hiding_tests(repo, config)
    ranking = plan.ranking
    assert ranking["chosen"] not in LEARNED, ranking
    figures = ranking["candidates"]
    on_trial = [c for c in figures if c["trial"]]
    assert {c["ranking"] for c in on_trial} == LEARNED
    assert all(c["ranking"] in LEARNED for c in on_trial)
    assert not any(c["trial"] for c in figures if c["ranking"] not in LEARNED)
    chosen = max(c["file_recall"] + c["edited_test_recall"] for c in figures if not c["trial"])
    # a learned candidate found more, and it was still not taken
    assert max(c["file_recall"] + c["edited_test_recall"] for c in on_trial) > chosen
    assert "(on trial)" in ranking["reason"]
    # without the trial the same history chooses the learned model (the cache keeps them apart)
    plan, _hidden = _select_hiding_tests(repo, replace(config, trial=()))
    assert plan.ranking["chosen"] == "learned"


def test_candidates_are_one_registry_of_frozen_values() -> None:
    keys = [c.key for c in REGISTRY]
    assert len(keys) == len(set(keys)) == 3 * 5 + 2 * 3 * 5
    assert REGISTRY[0] == BASELINE == Candidate("history", "whole")
    with pytest.raises(ValueError, match="unknown budget rule 'fastest'"):
        Candidate("history", "fastest")
    with pytest.raises(ValueError, match="unknown candidate"):
        on_trial(("history/spread/nowhere",))
    assert [c.key for c in on_trial(("learned/model",)) if c.trial] == ["learned/model"]


def test_too_little_history_ranks_with_prior_numbers(
    tmp_path: Path,
) -> None:
    repo = GitRepo(tmp_path / "small")
    repo.commit("base", {"pkg/a.py": "x = 1\n", "tests/test_a.py": "def test_a():\n    pass\n"})
    for n in range(3):
        repo.commit(
            f"c{n}", {"pkg/a.py": f"x = {n}\n", "tests/test_a.py": f"def test_a():\n    x = {n}\n"}
        )
    config = SelectorConfig(cache_dir=tmp_path / "cache", agent=LocalAgent(tmp_path / "cache"))
    plan, _ = _select_hiding_tests(repo, config)
    notes = " ".join(plan.notes)
    assert f"({MIN_CASES} needed)" in notes and "ranks with prior numbers" in notes
    assert plan.ranking["chosen"] == PRIOR.ranker and plan.ranking["allocation"] == PRIOR.rule
    assert plan.ranking["backtest_commits"] < MIN_CASES
    # the agent has not shown it helps here: it steps aside, its model never loaded
    assert plan.agent == "none" and "local agent skipped: too little history" in notes
    assert not (tmp_path / "cache" / "embeddings").exists()
    # the one test file changed with the source every time: history counting says so
    reasons = [e.reason for p in plan.selected for e in p.evidence if e.source == "ranking"]
    assert any("changed with these sources in 3 past commit(s)" in r for r in reasons), reasons


def test_a_shallow_clone_says_how_deep_and_uses_the_prior(tmp_path: Path) -> None:
    repo, _ = _generate(tmp_path, "repeats")
    shallow = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "5", f"file://{repo.path}", str(shallow)], check=True
    )
    plan, _ = _select_hiding_tests(GitRepo(shallow), SelectorConfig(cache_dir=tmp_path / "c"))
    notes = " ".join(plan.notes)
    assert "the clone is shallow: 4 commit(s) of history before the change" in notes, notes
    assert "ranks with prior numbers" in notes and plan.ranking["chosen"] == PRIOR.ranker
    assert plan.selected  # never a silent empty plan


def test_a_corrupt_backtest_cache_is_rebuilt_with_a_warning(tmp_path: Path) -> None:
    repo, _ = _generate(tmp_path, "repeats")
    config = SelectorConfig(budget=Budget.parse("2%"), cache_dir=tmp_path / "cache")
    first, _ = _select_hiding_tests(repo, config)
    stored = list((tmp_path / "cache").glob("backtest-v*/*/*.pickle"))
    assert len(stored) == 1
    stored[0].write_bytes(b"not a pickle")
    again, _ = _select_hiding_tests(repo, config)
    assert any("unreadable: rebuilt" in n for n in again.notes), again.notes
    assert again.ranking == first.ranking
    assert [p.test for p in again.selected] == [p.test for p in first.selected]
    # and the rebuilt entry is read back without a warning
    third, _ = _select_hiding_tests(repo, config)
    assert not any("unreadable" in n for n in third.notes)
    assert third.timings["backtest"] < first.timings["backtest"] or third.ranking == first.ranking


def test_the_backtest_truth_is_the_tests_each_commit_edited(tmp_path: Path) -> None:
    repo, _ = _generate(tmp_path, "imports")
    history = History.read(Repo(repo.path), "HEAD")
    universe = {f"tests/test_check_{k:03d}.py" for k in range(PAIRS)}
    cases = build_cases(
        Repo(repo.path), history, len(history.shas) - 1, universe, lambda p: p.startswith("tests/")
    )
    assert len(cases) == 60  # the newest sixty, newest first
    newest = cases[0]
    assert newest.sources == {_module(TRAINING + 70)}
    assert newest.truth == {_checker(TRAINING + 70): (2, (0,))}  # test_check_x, not _more


def test_test_bodies_match_what_changed() -> None:
    before = (
        "import pytest\n\n"
        "class TestA:\n"
        "    @pytest.mark.parametrize(\n        'a', [1, 2]\n    )\n"
        "    def test_x(self, a):\n        assert a\n\n"
        "    def helper(self):\n        def test_nested():\n            pass\n\n"
        "def test_sig(\n    a=1,\n):\n    return a\n"
    )
    tests = split_tests(before)
    assert set(tests) == {"TestA::test_x", "test_sig"}  # a def inside a function is no test
    assert edited_tests(before, before.replace("[1, 2]", "[1, 3]")) == {"TestA::test_x"}
    assert edited_tests(before, before.replace("return a", "return a + 1")) == {"test_sig"}
    assert edited_tests(before, before + "\n\ndef test_new():\n    pass\n") == set()


def test_default_layout_is_pytests_own_and_skips_hidden_and_build_folders() -> None:
    assert is_test_path("networkx/algorithms/tests/test_cycles.py")
    assert is_test_path("pkg/ops_test.py")
    assert not is_test_path(".github/scripts/test_ci.py")
    assert not is_test_path("build/lib/pkg/tests/test_x.py")


def test_the_prior_calibration_trusts_better_ranks_more() -> None:
    prior = Calibration.prior()
    chances = [prior.p_file(b) for b in range(10)]
    assert chances == sorted(chances, reverse=True) and chances[0] > chances[-1]
    shares = prior.shares(10)
    assert abs(sum(shares) - 1.0) < 1e-9 and list(shares) == sorted(shares, reverse=True)


def test_choice_cache_refuses_other_pickles(tmp_path: Path) -> None:
    cache = ChoiceCache(tmp_path, "key")
    cache.folder.mkdir(parents=True)
    import pickle

    (cache.folder / f"{'a' * 40}-0.1500-0.100.pickle").write_bytes(pickle.dumps({"x": 1}))
    choice, warning = cache.load("a" * 40, 0.15, 0.1)
    assert choice is None and warning and "rebuilt" in warning


def _fast_import(repo: GitRepo, commits: list[dict[str, str]]) -> None:
    """Write many commits at once (``git fast-import``), each a {path: content} change."""
    stream = []
    for n, files in enumerate(commits):
        stream.append("commit refs/heads/main")
        stream.append(f"committer T <t@example.invalid> {1_700_000_000 + n} +0000")
        message = f"c{n}"
        stream.append(f"data {len(message)}\n{message}")
        for path, content in files.items():
            data = content.encode()
            stream.append(f"M 100644 inline {path}\ndata {len(data)}")
            stream.append(content)
        stream.append("")
    subprocess.run(
        ["git", "fast-import", "--quiet"],
        cwd=repo.path,
        input="\n".join(stream).encode(),
        check=True,
    )


def test_a_change_of_ten_thousand_files_is_paths_only_with_a_note(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "sweep")
    base = {f"pkg/m{k:05d}.py": f"def f{k}():\n    return {k}\n" for k in range(10_000)}
    base |= {f"tests/test_t{k}.py": f"def test_t{k}():\n    assert {k}\n" for k in range(20)}
    history = [base]
    for n in range(1, 40):  # a history the backtest can replay
        history.append(
            {
                f"pkg/m{n:05d}.py": f"def f{n}():\n    return -{n}\n",
                f"tests/test_t{n % 20}.py": f"def test_t{n % 20}():\n    assert -{n}\n",
            }
        )
    history.append(
        {
            path: text.replace("return", "return 1 +")
            for path, text in base.items()
            if path.startswith("pkg/")
        }
    )
    _fast_import(repo, history)
    plan, change = select(
        repo.path,
        "main^",
        "main",
        None,
        SelectorConfig(budget=Budget.parse("10%"), cache_dir=tmp_path / "cache"),
    )
    assert len(change.files) == 10_000 and change.truncated
    notes = " ".join(plan.notes)
    assert "more than 5000, so symbols were not compared" in notes
    assert 1 <= len(plan.selected) <= 4  # within the budget, never empty


LETTERS = "abcdefghij"


def _ten_test_file(edited: set[str], n: int) -> str:
    return "".join(
        f"def test_{x}():\n    assert {n if x in edited else 0} >= 0\n\n\n" for x in LETTERS
    )


def _agent_history(tmp_path: Path) -> GitRepo:
    """Commits that edit two of a file's ten tests; the change's words never name them, but
    a comment in the change says which (what only a reader of the change can use)."""
    repo = GitRepo(tmp_path / "agent")
    repo.commit(
        "base",
        {"pkg/m.py": "def f():\n    return 0\n", "tests/test_m.py": _ten_test_file(set(), 0)},
    )
    for n in range(1, 30):
        pair = {LETTERS[(3 * n) % 10], LETTERS[(3 * n + 5) % 10]}
        note = " ".join(f"touches {x}" for x in sorted(pair))
        repo.commit(
            f"c{n}",
            {
                "pkg/m.py": f"def f():\n    # {note}\n    return {n}\n",
                "tests/test_m.py": _ten_test_file(pair, n),
            },
            dedent=False,
        )
    return repo


def _oracle(hunks: list[str], texts: list[str]) -> list[float]:
    """Reads "touches x" in the change and points at test_x."""
    named = {part[:1] for hunk in hunks for part in hunk.split("touches ")[1:]}
    return [1.0 if any(f"def test_{x}(" in t for x in named) else 0.0 for t in texts]


class _Reader:
    """The agent protocol around a similarity function, reading everything at once."""

    def __init__(self, name: str, similarity: Callable[[list[str], list[str]], list[float]]):
        self.name = name
        self.similarity = similarity
        self.read: set[str] = set()

    def embed_ahead(self, texts: list[str], budget: int) -> int:
        todo = [t for t in dict.fromkeys(texts) if t not in self.read]
        self.read |= set(todo[:budget])
        return max(0, len(todo) - budget)

    def similarities(self, hunks: list[str], texts: list[str]) -> list[float]:
        return self.similarity(hunks, texts)


@pytest.mark.parametrize(
    ("similarity", "runs"), [(_oracle, True), (lambda h, t: [0.5] * len(t), False)]
)
def test_an_agent_runs_only_where_the_backtest_shows_it_places_edited_tests_earlier(
    tmp_path: Path,
    similarity: Callable[[list[str], list[str]], list[float]],
    runs: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_check, "AGENT_NEW_TEXTS", 10)
    repo = _agent_history(tmp_path)
    history = History.read(Repo(repo.path), "HEAD")
    reader = _Reader("reader", similarity)

    def measure() -> agent_check.AgentVerdict:
        return agent_check.measure_agent(
            Repo(repo.path),
            history,
            len(history.shas) - 1,
            {"tests/test_m.py"},
            lambda p: p.startswith("tests/"),
            reader,
        )

    verdict = measure()  # the tests of 12 commits' files to read, 10 at a time
    assert verdict.pending > 0 and not verdict.runs
    assert verdict.note().startswith(
        f"the reader agent was skipped while it is measured: {verdict.pending} test"
    )
    for _ in range(20):
        left = verdict.pending
        verdict = measure()
        assert verdict.pending == max(0, left - 10)
        if not verdict.pending:
            break
    assert verdict.pending == 0 and verdict.measured >= agent_check.MIN_AGENT_TESTS
    assert verdict.runs is runs, verdict
    if runs:
        assert verdict.with_agent < verdict.words - agent_check.AGENT_MARGIN
        assert verdict.note().startswith("the reader agent orders tests within files")
    else:
        assert verdict.note().startswith("the reader agent was skipped: on 12 past commit(s)")


class _CountingReader(LocalAgent):
    """The local agent's protocol with a reading that helps nothing, counting its calls."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(cache_dir)
        self.texts = 0

    def embed_ahead(self, texts: list[str], budget: int) -> int:
        self.texts += len(texts)
        return 0

    def similarities(self, hunks: list[str], texts: list[str]) -> list[float]:
        return [0.5] * len(texts)


def test_the_agents_verdict_is_measured_once_for_the_next_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(choice, "REFIT_EVERY", 1)  # a new anchor, so a new backtest, per commit
    monkeypatch.setattr(backtest, "AGENT_REMEASURE", 20)  # ... but one agent anchor for both
    repo = _agent_history(tmp_path)
    agent = _CountingReader(tmp_path / "cache")
    config = SelectorConfig(budget=Budget.parse("30%"), cache_dir=tmp_path / "cache", agent=agent)
    first, _ = select(
        repo.path, "HEAD~2", "HEAD~1", None, config, exclude_paths={"tests/test_m.py"}
    )
    # the first selection replays the ranking's backtest: the agent waits for the next one
    assert agent.texts == 0 and first.agent == "none"
    assert any("measured from the next selection on" in n for n in first.notes), first.notes
    plan, _ = select(repo.path, "HEAD~2", "HEAD~1", None, config, exclude_paths={"tests/test_m.py"})
    measured = agent.texts
    assert measured > 0
    skipped = [n for n in plan.notes if n.startswith("the local agent was skipped: on ")]
    assert skipped and plan.agent == "none"
    # a new ranking anchor (its backtest runs again) reuses the agent's verdict
    again, _ = select(repo.path, "HEAD~1", "HEAD", None, config, exclude_paths={"tests/test_m.py"})
    assert agent.texts == measured  # the verdict of the commit before serves
    assert again.ranking["anchor"] != plan.ranking["anchor"]
    assert [n for n in again.notes if n.startswith("the local agent was skipped")] == skipped


def test_history_follows_renames_so_a_moved_test_keeps_its_past(tmp_path: Path) -> None:
    repo = GitRepo(tmp_path / "moved")
    body = "".join(f"def test_{x}():\n    assert '{x}' * 40\n\n\n" for x in LETTERS)
    repo.commit("base", {"pkg/m.py": "x = 0\n", "tests/test_old.py": body})
    repo.commit("edit", {"pkg/m.py": "x = 1\n", "tests/test_old.py": body.replace("'a'", "'A'")})
    repo.commit(
        "move", {"tests/test_old.py": None, "tests/unit/test_new.py": body.replace("'a'", "'A'")}
    )
    history = History.read(Repo(repo.path), "HEAD")
    assert history.files[1] == ("pkg/m.py", "tests/unit/test_new.py")  # the edit, by its new name
    assert "tests/unit/test_new.py" in history.modified[1]
    assert "tests/test_old.py" not in history.postings
