"""Each selector stage on real git repositories built in the test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ci_relay.sample_upstream import SampleUpstream
from test_selection import change_analysis, inventory
from test_selection.agents import NoAgent
from test_selection.candidates import (
    AlwaysRun,
    Context,
    EditedByChange,
    FailureHistory,
    collect_evidence,
    prior_signals,
)
from test_selection.change_analysis import analyze
from test_selection.git import GitError, Repo
from test_selection.inventory import build_inventory
from test_selection.plan import durations_for, load_durations, make_plan
from test_selection.ranking.candidate import PRIOR
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget, Evidence, Scored, TestId
from tests.conftest import CliResult
from tests.gitrepo import GitRepo

TEST_MATH = """
import torch
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db

_mine = [op for op in op_db if op.name in ("softplus", "hardswish")]


class TestMath(TestCase):
    @dtypes(torch.float32)
    def test_softplus(self, device, dtype):
        torch.nn.functional.softplus(torch.ones(2))

    @ops(_mine)
    def test_opinfo(self, device, dtype, op):
        pass

    def helper(self):
        pass


class TestPlain(TestCase):
    def test_plain(self):
        mymod.frobnicate(1)


def test_module_level():
    assert True


instantiate_device_type_tests(TestMath, globals())
"""

SRC = """
def frobnicate(x):
    return x + 1


def unrelated(y):
    return y * 2
"""


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    r = GitRepo(tmp_path / "up")
    r.commit("init", {"test/test_math.py": TEST_MATH, "torch/mymod.py": SRC, "README.md": "x\n"})
    return r


def test_inventory_reads_tests_without_importing(repo: GitRepo, tmp_path: Path) -> None:
    inv = build_inventory(Repo(repo.path), "HEAD", cache_dir=tmp_path / "cache")
    ids = sorted(t.id.nodeid for t in inv.tests())
    assert ids == [
        "test/test_math.py::TestMath::test_opinfo",
        "test/test_math.py::TestMath::test_softplus",
        "test/test_math.py::TestPlain::test_plain",
        "test/test_math.py::test_module_level",
    ]
    file = inv.files["test/test_math.py"]
    assert file.device_classes == ["TestMath"]
    by_id = inv.by_id()
    opinfo = by_id[TestId("test/test_math.py", "TestMath", "test_opinfo")]
    assert "ops" in opinfo.decorators and {"softplus", "hardswish"} <= set(opinfo.references)
    softplus = by_id[TestId("test/test_math.py", "TestMath", "test_softplus")]
    assert (
        "torch.nn.functional.softplus" in softplus.references
        and softplus.lineno < softplus.end_lineno
    )


def test_inventory_cache_never_reparses_an_unchanged_tree(
    repo: GitRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first = build_inventory(Repo(repo.path), "HEAD", cache_dir=cache)

    def refuse(*args: object) -> None:
        raise AssertionError("re-parsed a cached file")

    monkeypatch.setattr(inventory, "parse_test_file", refuse)
    again = build_inventory(Repo(repo.path), "HEAD", cache_dir=cache)
    assert [t.id for t in again.tests()] == [t.id for t in first.tests()]
    # a new commit that leaves the test file alone reuses its parsed blob
    repo.commit("docs", {"README.md": "y\n"})
    assert len(build_inventory(Repo(repo.path), "HEAD", cache_dir=cache).tests()) == 4


def test_change_analysis_compares_asts(repo: GitRepo) -> None:
    base = repo.git("rev-parse", "HEAD")
    reformatted = SRC.replace("return x + 1", "return (x\n            + 1)")
    edited_tests = TEST_MATH.replace(
        "pass\n\n    def helper", "assert op is not None\n\n    def helper"
    ).replace("def test_module_level():\n    assert True", "def test_new_one():\n    assert 1")
    head = repo.commit(
        "change",
        {
            "torch/mymod.py": reformatted.replace("return y * 2", "return y * 3"),
            "test/test_math.py": edited_tests,
            "aten/src/ATen/native/native_functions.yaml": "- func: softplus(Tensor self) -> Tensor\n",
            "torch/logo.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00binary",
            "README.md": None,
        },
    )
    a = analyze(Repo(repo.path), base, head)
    statuses = {f.path: f.status for f in a.files}
    assert statuses["README.md"] == "D" and statuses["torch/logo.png"] == "A"
    assert next(f for f in a.files if f.path == "torch/logo.png").binary
    # the reformat of frobnicate is not a change; the edit of unrelated is
    assert "torch/mymod.py:unrelated" in a.symbols and "torch/mymod.py:frobnicate" not in a.symbols
    assert TestId("test/test_math.py", "TestMath", "test_opinfo") in a.tests_modified
    assert TestId("test/test_math.py", None, "test_new_one") in a.tests_added
    assert TestId("test/test_math.py", None, "test_module_level") in a.tests_removed
    assert "softplus" in a.ops


def test_renames_and_unparsable_files(repo: GitRepo) -> None:
    base = repo.git("rev-parse", "HEAD")
    repo.git("mv", "torch/mymod.py", "torch/renamed.py")
    head = repo.commit("rename and break", {"torch/broken.py": "def f(:\n"})
    a = analyze(Repo(repo.path), base, head)
    renamed = next(f for f in a.files if f.path == "torch/renamed.py")
    assert renamed.status == "R" and renamed.old_path == "torch/mymod.py"
    assert any("torch/broken.py: does not parse" in e for e in a.parse_errors)


def test_unknown_sha_and_shallow_clone(repo: GitRepo, tmp_path: Path) -> None:
    with pytest.raises(GitError, match="unknown revision 'deadbeef'"):
        analyze(Repo(repo.path), "deadbeef", "HEAD")
    repo.commit("second", {"README.md": "2\n"})
    repo.commit("third", {"README.md": "3\n"})
    shallow = tmp_path / "shallow"
    GitRepo.__new__(GitRepo)
    import subprocess

    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{repo.path}", str(shallow)], check=True
    )
    with pytest.raises(GitError, match="shallow"):
        analyze(Repo(shallow), "HEAD~2", "HEAD")


def test_huge_diffs_degrade_to_paths(repo: GitRepo, monkeypatch: pytest.MonkeyPatch) -> None:
    base = repo.git("rev-parse", "HEAD")
    head = repo.commit("vendor drop", {f"third_party/x{i}.py": f"v = {i}\n" for i in range(40)})
    monkeypatch.setattr(change_analysis, "MAX_FILES", 30)
    a = analyze(Repo(repo.path), base, head)
    assert a.truncated and len(a.files) == 40 and not a.symbols
    assert "more than 30" in a.parse_errors[0]


def _ctx(inv: inventory.Inventory, **kw: object) -> Context:
    return Context({t.id for t in inv.tests()}, **kw)  # type: ignore[arg-type]


def test_signals_and_the_prior_ranking_each_give_scored_reasons(
    repo: GitRepo, tmp_path: Path
) -> None:
    """The signals beside the ranking each say why; on a history too short to replay, the
    prior ranking (history counting on prior numbers) and the names a test uses find what
    the retired hand weights did: the file that changed with the source, and in it the test
    that uses the changed function."""
    # history: mymod and test_math changed together twice
    repo.commit(
        "a", {"torch/mymod.py": SRC + "\nA = 1\n", "test/test_math.py": TEST_MATH + "\n# a\n"}
    )
    repo.commit(
        "b", {"torch/mymod.py": SRC + "\nA = 2\n", "test/test_math.py": TEST_MATH + "\n# b\n"}
    )
    base = repo.git("rev-parse", "HEAD")
    head = repo.commit(
        "touch frobnicate", {"torch/mymod.py": SRC.replace("x + 1", "x + 2") + "\nA = 2\n"}
    )
    r = Repo(repo.path)
    change = analyze(r, base, head)
    inv = build_inventory(r, head, cache_dir=tmp_path / "c")
    plain = TestId("test/test_math.py", "TestPlain", "test_plain")
    always = dict(
        AlwaysRun().evidence(change, inv, _ctx(inv, always_run=("*::test_module_level",)))
    )
    assert list(always) == [TestId("test/test_math.py", None, "test_module_level")]
    fails = dict(FailureHistory().evidence(change, inv, _ctx(inv, failure_history={plain: 3})))
    assert fails[plain].score == pytest.approx(0.5)
    edited = dict(EditedByChange().evidence(change, inv, _ctx(inv)))
    assert edited == {}  # no test edited in this change
    assert collect_evidence(change, inv, _ctx(inv)) == {}  # nothing failed or always runs
    # where the ranking is unmeasured, a test naming a changed function says so (rarity-weighted)
    named = collect_evidence(change, inv, _ctx(inv), prior_signals())
    assert [e.source for e in named[plain]] == ["references-change"]
    assert "frobnicate" in named[plain][0].reason

    config = SelectorConfig(budget=Budget("all"), agent=NoAgent(), cache_dir=tmp_path / "s")
    plan, _ = select(Path(repo.path), base, head, config=config)
    assert plan.ranking["chosen"] == PRIOR.ranker and "prior numbers" in plan.ranking["reason"]
    by_test = {item.test: item for item in plan.selected}
    assert {e.source for e in by_test[plain].evidence} >= {"ranking", "references-change"}
    (said,) = [e.reason for e in by_test[plain].evidence if e.source == "ranking"]
    assert "changed with these sources in 3 past commit(s)" in said, said  # with the first
    assert "uses frobnicate from the change" in said, said  # never Python's keywords
    others = [t for t in by_test if t.file == plain.file and t != plain]
    assert others and all(by_test[plain].score > by_test[t].score for t in others)


def test_plan_budgets_mandatory_and_lpt_shards(tmp_path: Path) -> None:
    tests = [TestId(f"test/test_{i % 3}.py", "T", f"test_{i}") for i in range(20)]
    scored = {
        t: Scored(t, [Evidence("candidates", "co-change", 0.05 * (i + 1), "x")])
        for i, t in enumerate(tests)
    }
    scored[tests[0]].evidence.append(Evidence("candidates", "edited-by-change", 1.0, "edited"))
    durations = {t: float(i % 5 + 1) for i, t in enumerate(tests)}
    selected, excluded, shards, notes = make_plan(scored, Budget.parse("10%"), durations, 2)
    assert len(selected) == 2 and tests[0] in {p.test for p in selected}
    assert len(selected) + len(excluded) == 20
    selected, _, shards, notes = make_plan(scored, Budget.parse("5"), durations, 3)
    assert len(selected) == 5 and sum(len(s) for s in shards) == 5
    loads = [sum(durations[TestId.parse(n)] for n in shard) for shard in shards]
    assert max(loads) - min(loads) <= max(durations.values())  # LPT keeps shards balanced
    selected, _, _, _ = make_plan(scored, Budget.parse("6s"), durations, 1)
    assert sum(p.duration for p in selected) <= 6 or len(selected) == 1
    # budgets are honest: an edited test that does not fit is left out and said so; a budget
    # smaller than every test runs the top-ranked one alone (never an empty plan)
    selected, _, _, notes = make_plan(scored, Budget.parse("0.5s"), durations, 1)
    assert [p.test for p in selected] == [tests[0]]
    assert "did not fit the 0.5s budget" in notes[0] and "runs alone" in notes[1]
    # a count budget is never exceeded, even by tests the change edits
    for t in tests[:5]:
        scored[t].evidence.append(Evidence("candidates", "edited-by-change", 1.0, "edited"))
    selected, _, _, notes = make_plan(scored, Budget.parse("10%"), durations, 1)
    assert len(selected) == 2 and "3 test(s) the change edits or references did not fit" in notes[0]
    for t in tests[:5]:
        scored[t].evidence.pop()
    # never an empty plan: with no evidence at all, a safety net is selected
    bare = {t: Scored(t) for t in tests}
    selected, _, _, notes = make_plan(bare, Budget.parse("10%"), durations, 1)
    assert len(selected) == 2 and "safety net" in notes[0]


def test_durations_in_test_times_shape(tmp_path: Path) -> None:
    path = tmp_path / "test-times.json"
    path.write_text('{"default": {"test_0": 30.0, "nn/test_x": 4}, "slow": {"test_0": 60}}')
    seconds = load_durations(path)
    assert seconds == {"test_0": 60.0, "nn/test_x": 4.0}
    tests = [
        TestId("test/test_0.py", "T", "a"),
        TestId("test/test_0.py", "T", "b"),
        TestId("test/other.py", None, "c"),
    ]
    per_test = durations_for(tests, seconds, {tests[2]: 7.0})
    assert per_test == {tests[0]: 30.0, tests[1]: 30.0, tests[2]: 7.0}
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_durations(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("15%", "fraction", 0.15),
        ("600s", "seconds", 600.0),
        ("200", "count", 200.0),
        ("all", "all", 0.0),
    ],
)
def test_budget_parsing(text: str, kind: str, value: float) -> None:
    budget = Budget.parse(text)
    assert (budget.kind, budget.value) == (kind, value)


@pytest.mark.parametrize("text", ["", "15 %%", "-3", "0%", "120%", "fast"])
def test_bad_budgets(text: str) -> None:
    with pytest.raises(ValueError, match="bad budget"):
        Budget.parse(text)


@pytest.mark.parametrize(
    ("text", "meant"),
    [("0.15", "did you mean 15%?"), ("0.5", "did you mean 50%?"), ("12.5", "12 tests"), ("0", "")],
)
def test_a_count_below_one_or_not_whole_is_refused_with_what_was_meant(
    text: str, meant: str
) -> None:
    with pytest.raises(ValueError, match="a count of tests is a whole number") as refused:
        Budget.parse(text)
    assert meant in str(refused.value)


def test_select_refuses_a_fractional_count_before_selecting(
    sample_upstream: SampleUpstream, cli: Callable[..., CliResult]
) -> None:
    done = cli(
        "select", "--upstream", sample_upstream.path, "--base", "HEAD~1", "--head", "HEAD",
        "--budget", "0.15", "--agent", "none",
    )  # fmt: skip
    assert done.code == 2 and "did you mean 15%?" in done.output, done.output


def test_the_relay_refuses_a_fractional_count_budget_at_start_up() -> None:
    from pydantic import ValidationError

    from ci_relay.settings import Settings

    with pytest.raises(ValidationError, match="did you mean 15%"):
        Settings(selection_budget="0.15")
    assert Settings(selection_budget="15%").selection_budget == "15%"


def test_select_eval_baselines_take_whole_files_by_one_signal(tmp_path: Path) -> None:
    """``select-eval``'s one-signal baselines: co-change counts alone, path words alone."""
    from test_selection.evaluate import _baseline_files
    from test_selection.ranking.history import History

    repo = GitRepo(tmp_path / "up")
    files = {"src/alpha.py": "a = 0\n", "src/beta.py": "b = 0\n"}
    files |= {f"tests/test_{n}.py": f"def test_{n}():\n    pass\n" for n in ("one", "beta")}
    repo.commit("base", files)
    for n in range(2):  # alpha changes with test_one, never with test_beta
        repo.commit(f"c{n}", {"src/alpha.py": f"a = {n}\n", "tests/test_one.py": f"# {n}\n"})
    history = History.read(Repo(repo.path), repo.git("rev-parse", "HEAD"))
    sizes = {"tests/test_one.py": 3, "tests/test_beta.py": 3}
    assert _baseline_files("co-change-only", history, {"src/alpha.py"}, sizes, 2) == {
        "tests/test_one.py"
    }
    assert _baseline_files("path-only", history, {"src/beta.py"}, sizes, 2) == {
        "tests/test_beta.py"
    }
    # nothing in common with either: no file, rather than a guess
    assert _baseline_files("path-only", history, {"src/gamma.py"}, sizes, 2) == set()
