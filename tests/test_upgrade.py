"""``ci-relay upgrade``: the test-level diff between two upstream revisions, the spec impact,
and a patch that keeps the spec's comments, through the real command line."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from ci_relay.sample_upstream import SampleUpstream
from reuse_specs.spec_patch import PatchError, SpecEdit, patch_spec_text
from tests.conftest import CliResult
from tests.gitrepo import GitRepo

HELPERS_A = """
def make_input(n):
    return list(range(n))


def unrelated():
    return 1
"""
HELPERS_B = HELPERS_A.replace("list(range(n))", "[float(i) for i in range(n)]")

TESTS_A = """
from torch_helpers import make_input, unrelated


class TestShapes:
    def setUp(self):
        self.n = 3

    def test_reshape_old_name(self):
        x = make_input(4)
        assert len(x) == 4

    def test_flatten(self):
        assert unrelated() == 1

    def test_going_away(self):
        assert True

    def test_body_edit(self):
        assert 1 + 1 == 2

    def test_untouched(self):
        assert self.n == 3
"""
# B: one test renamed (same body), one removed, one edited, one added; a helper changed
TESTS_B = (
    TESTS_A.replace("test_reshape_old_name", "test_reshape")
    .replace(
        """    def test_going_away(self):
        assert True

""",
        "",
    )
    .replace("assert 1 + 1 == 2", "assert 2 + 2 == 4")
    + """
    def test_brand_new(self):
        assert make_input(2) == [0.0, 1.0]
"""
)

SPEC = """\
# Spec for the shapes tests (kept by hand: every comment must survive the upgrade)
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_shapes.py  # the file we reuse
      unlisted_test_mode: mandatory_success
      tests:
        # known problems on the card
        - names: [TestShapes::test_reshape_old_name, "TestShapes::test_flatten"]  # flow list
          mode: xfail
        - names:
            - TestShapes::test_going_away  # it hung once
            - 'TestShapes::test_body_edit'  # quoted on purpose
          mode: skip
"""


@pytest.fixture
def release_repo(tmp_path: Path) -> tuple[GitRepo, str, str]:
    repo = GitRepo(tmp_path / "upstream")
    a = repo.commit("release A", {"test/test_shapes.py": TESTS_A, "torch_helpers.py": HELPERS_A})
    repo.commit("unrelated work", {"README.md": "notes\n"})
    b = repo.commit("release B", {"test/test_shapes.py": TESTS_B, "torch_helpers.py": HELPERS_B})
    return repo, a, b


def _spec(tmp_path: Path) -> Path:
    path = tmp_path / "specs" / "shapes.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SPEC, encoding="utf-8")
    return path


def test_upgrade_diffs_tests_and_proposes_a_comment_keeping_patch(
    cli: Callable[..., CliResult], tmp_path: Path, release_repo: tuple[GitRepo, str, str]
) -> None:
    repo, a, b = release_repo
    spec = _spec(tmp_path)
    result = cli(
        "upgrade", "--upstream", repo.path, "--from", a, "--to", b, "--spec", spec, "--json"
    )
    assert result.code == 0, result.output
    report = json.loads(result.stdout)
    assert report["commits"] == 2
    kinds = {c["test"].split("::")[-1]: c for c in report["changes"]}
    assert kinds["test_reshape"]["kind"] == "renamed"
    assert kinds["test_reshape"]["was"] == "test/test_shapes.py::TestShapes::test_reshape_old_name"
    assert kinds["test_going_away"]["kind"] == "removed"
    assert kinds["test_body_edit"]["kind"] == "body"
    assert kinds["test_brand_new"]["kind"] == "added"
    # unchanged bodies: test_flatten uses a helper that did not change, test_untouched
    # nothing that changed; neither needs a run
    assert "test_flatten" not in kinds and "test_untouched" not in kinds
    assert report["tests_at_head"] == 5 and report["need_run"] == 3
    assert report["run_list"] == [
        "test/test_shapes.py::TestShapes::test_body_edit",
        "test/test_shapes.py::TestShapes::test_brand_new",
        "test/test_shapes.py::TestShapes::test_reshape",
    ]
    impact = report["spec_impact"]
    assert {(e["kind"], e["old"], e["new"]) for e in impact["edits"]} == {
        ("rename_test", "TestShapes::test_reshape_old_name", "TestShapes::test_reshape"),
        ("remove_test", "TestShapes::test_going_away", None),
    }
    assert [t["test"].split("::")[-1] for t in impact["new_tests"]] == ["test_brand_new"]
    assert impact["new_tests"][0]["mode"] == "mandatory_success"
    assert report["patch_problems"] == []
    patch = report["patch"]
    assert "-        - names: [TestShapes::test_reshape_old_name, " in patch
    assert "+        - names: [TestShapes::test_reshape, " in patch
    assert "+            # removed upstream: - TestShapes::test_going_away  # it hung once" in patch


def test_the_helper_a_test_uses_puts_it_in_the_run(
    cli: Callable[..., CliResult], tmp_path: Path, release_repo: tuple[GitRepo, str, str]
) -> None:
    repo, _a, _b = release_repo
    # C: only the helper changes again; the test that uses it must run, the others need not
    c = repo.commit(
        "helper only", {"torch_helpers.py": HELPERS_B.replace("float(i)", "float(i) * 1.0")}
    )
    spec = _spec(tmp_path)
    result = cli(
        "upgrade", "--upstream", repo.path, "--from", f"{c}~1", "--to", c, "--spec", spec, "--json"
    )
    report = json.loads(result.stdout)
    changed = {c["test"].split("::")[-1]: c for c in report["changes"]}
    assert set(changed) == {"test_reshape", "test_brand_new"}, changed
    assert changed["test_reshape"]["kind"] == "dependencies"
    assert changed["test_reshape"]["evidence"] == [
        "uses make_input, changed in torch_helpers.py:make_input"
    ]
    # the spec was written for A: its drift at C is fixed by the patch, so the exit is 0
    assert result.code == 0 and report["patch"], result.output


def test_apply_writes_a_spec_that_checks_at_the_new_revision(
    cli: Callable[..., CliResult], tmp_path: Path, release_repo: tuple[GitRepo, str, str]
) -> None:
    repo, a, b = release_repo
    spec = _spec(tmp_path)
    before = cli("specs", "check", spec, "--upstream", repo.path)
    assert before.code == 1  # the spec was written for A
    patch_file = tmp_path / "out" / "spec.patch"
    human = cli(
        "upgrade", "--upstream", repo.path, "--from", a, "--to", b, "--spec", spec,
        "--patch", patch_file, "--apply",
    )  # fmt: skip
    assert human.code == 0, human.output
    assert "3 of 5 tests need a run" in human.stdout
    assert "proposed patch" in human.stdout
    assert "applied: 1 spec file(s) rewritten" in human.stderr
    text = spec.read_text()
    for comment in ("# Spec for the shapes tests", "# the file we reuse", "# known problems",
                    "# flow list", "# it hung once", "# quoted on purpose"):  # fmt: skip
        assert comment in text, comment
    assert "'TestShapes::test_body_edit'" in text  # its quoting kept
    assert patch_file.read_text().startswith("--- a/shapes.yaml\n+++ b/shapes.yaml\n")
    after = cli("specs", "check", spec, "--upstream", repo.path)
    assert after.code == 0, after.output
    again = cli(
        "upgrade", "--upstream", repo.path, "--from", a, "--to", b, "--spec", spec, "--json"
    )
    assert json.loads(again.stdout)["patch"] == ""  # nothing left to edit


def test_upgrade_on_the_sample_upstream(
    cli: Callable[..., CliResult], tmp_path: Path, sample_upstream: SampleUpstream
) -> None:
    first, last = sample_upstream.commits[0].sha, sample_upstream.commits[-1].sha
    spec = tmp_path / "sample.yaml"
    spec.write_text(
        "test_suite_config:\n  files:\n"
        "    - path: ${TORCH_ROOT}/test/test_view_ops.py  # views\n"
        "      unlisted_test_mode: mandatory_success\n"
        "    - path: ${TORCH_ROOT}/test/test_binary_ufuncs.py\n"
        "      unlisted_test_mode: mandatory_success\n"
    )
    result = cli(
        "upgrade", "--upstream", sample_upstream.path, "--from", first, "--to", last,
        "--spec", spec, "--json",
    )  # fmt: skip
    assert result.code == 0, result.output
    report = json.loads(result.stdout)
    changes = {c["test"].split("::")[-1]: c for c in report["changes"]}
    assert report["commits"] == 5
    assert changes["test_transpose_zero_dim"]["kind"] == "added"  # commit 3
    assert changes["test_prod_reference"]["kind"] == "added"  # commit 5
    # commit 3 fixed transpose in _refs: the view test that transposes must rerun
    assert changes["test_transpose_strides"]["kind"] == "dependencies"
    assert "uses transpose" in changes["test_transpose_strides"]["evidence"][0]
    # the @ops tests run again for the ops whose references changed, and only those
    scalar = changes["test_scalar_support"]
    assert scalar["kind"] == "dependencies" and "prod" in scalar["ops"]
    assert "test_view_shares_storage" not in changes  # nothing it uses changed
    assert report["need_run"] < report["tests_at_head"]

    # variants: B's tests collected under the spec; an @ops test counts only the variants of
    # the ops whose entries changed
    counted = cli(
        "upgrade", "--upstream", sample_upstream.path, "--from", first, "--to", last,
        "--spec", spec, "--variants",
    )  # fmt: skip
    assert counted.code == 0, counted.output
    headline = next(line for line in counted.stdout.splitlines() if "test variants" in line)
    need, _of, total = headline.split()[:3]
    binary = re.search(r"^\s+(\d+) of\s+(\d+)  test/test_binary_ufuncs.py$", counted.stdout, re.M)
    assert binary is not None, counted.stdout
    binary_need, binary_total = int(binary[1]), int(binary[2])
    assert 0 < int(need) < int(total)
    assert 0 < binary_need < binary_total  # not every op's variants


def test_bad_input_is_refused_clearly_and_writes_nothing(
    cli: Callable[..., CliResult], tmp_path: Path, release_repo: tuple[GitRepo, str, str]
) -> None:
    repo, a, b = release_repo
    spec = _spec(tmp_path)
    original = spec.read_text()
    unknown = cli("upgrade", "--upstream", repo.path, "--from", "v9.9", "--to", b, "--spec", spec)
    assert unknown.code == 2 and "unknown revision 'v9.9'" in unknown.stderr
    option = cli("upgrade", "--upstream", repo.path, "--from", "--upload-pack=x", "--to", b,
                 "--spec", spec)  # fmt: skip
    assert option.code == 2 and "unknown revision" in option.stderr
    not_git = tmp_path / "plain"
    not_git.mkdir()
    plain = cli("upgrade", "--upstream", not_git, "--from", a, "--to", b, "--spec", spec)
    assert plain.code == 2 and "is not a git repository" in plain.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("test_suite_config:\n  files:\n    - path: x.py\n      bogus: 1\n")
    bad_spec = cli("upgrade", "--upstream", repo.path, "--from", a, "--to", b, "--spec", broken)
    assert bad_spec.code == 2 and "the specs do not load against A" in bad_spec.stderr
    assert "unknown key 'bogus'" in bad_spec.stderr
    # a glob that matches nothing at B: no edit can fix it, so --apply refuses and writes nothing
    glob_spec = tmp_path / "specs" / "glob.yaml"
    glob_spec.write_text(SPEC.replace("TestShapes::test_flatten", "TestShapes::test_gone_*"))
    refused = cli("upgrade", "--upstream", repo.path, "--from", a, "--to", b,
                  "--spec", glob_spec, "--apply")  # fmt: skip
    assert refused.code == 1, refused.output
    assert "needs a person" in refused.stdout and "test_gone_*" in refused.stdout
    assert "the patch was not applied" in refused.stderr
    assert glob_spec.read_text() == SPEC.replace(
        "TestShapes::test_flatten", "TestShapes::test_gone_*"
    )
    assert spec.read_text() == original


def test_a_test_file_that_does_not_parse_at_one_side_counts_as_changed(
    cli: Callable[..., CliResult], tmp_path: Path, release_repo: tuple[GitRepo, str, str]
) -> None:
    repo, _a, b = release_repo
    c = repo.commit("broken", {"test/test_shapes.py": TESTS_B + "\n    def broken(:\n"})
    spec = tmp_path / "plain.yaml"
    spec.write_text("test_suite_config:\n  files:\n    - path: ${TORCH_ROOT}/test/test_shapes.py\n")
    result = cli(
        "upgrade", "--upstream", repo.path, "--from", b, "--to", c, "--spec", spec, "--json"
    )
    report = json.loads(result.stdout)
    assert any("does not parse at one side" in note for note in report["notes"]), report["notes"]
    assert report["by_kind"]["removed"] == 5  # B's tests cannot be read at C: all listed
    assert all("does not parse at B" in c["evidence"][0] for c in report["changes"])


def test_patch_edits_keep_everything_else_byte_for_byte() -> None:
    text = (
        "# head\nanchors: &mode xfail\ntest_suite_config:\n  files:\n"
        "    - path: a.py   # keep\n      tests:\n"
        "        - names: [A::one, A::two]   # pair\n          mode: *mode\n"
    )
    out = patch_spec_text(text, [SpecEdit("rename_test", "a.py", "A::two", "A::deux")])
    assert out == text.replace("A::two]", "A::deux]")
    with pytest.raises(PatchError, match="no such entry"):
        patch_spec_text(text, [SpecEdit("remove_test", "b.py", "A::one")])
    with pytest.raises(PatchError, match="does not parse"):
        patch_spec_text("a: [unclosed", [])


def test_changes_that_cannot_alter_behaviour_rerun_nothing(
    cli: Callable[..., CliResult], tmp_path: Path, release_repo: tuple[GitRepo, str, str]
) -> None:
    """A docstring edit, a helper moved to another module, a benchmark the tests never
    import: none of them puts a test in the run; a real edit of the moved helper does."""
    repo, _a, b = release_repo
    moved = HELPERS_B.replace("def make_input(n):", 'def make_input(n):\n    """Inputs."""')
    c = repo.commit(
        "cosmetic",
        {
            "torch_helpers.py": "from torch_more import make_input\n\n\ndef unrelated():\n"
            "    return 1\n",
            "torch_more.py": moved,  # make_input moved here, with a docstring added
            "benchmarks/bench_shapes.py": "def make_input(n):\n    return n\n",
        },
    )
    spec = tmp_path / "plain.yaml"
    spec.write_text("test_suite_config:\n  files:\n    - path: ${TORCH_ROOT}/test/test_shapes.py\n")
    quiet = cli(
        "upgrade", "--upstream", repo.path, "--from", b, "--to", c, "--spec", spec, "--json"
    )
    assert json.loads(quiet.stdout)["changes"] == [], quiet.stdout
    d = repo.commit("real", {"torch_more.py": moved.replace("float(i)", "float(i + 1)")})
    real = cli("upgrade", "--upstream", repo.path, "--from", b, "--to", d, "--spec", spec, "--json")
    changed = {c["test"].split("::")[-1] for c in json.loads(real.stdout)["changes"]}
    assert changed == {"test_reshape", "test_brand_new"}, real.stdout


def test_a_range_too_wide_to_compare_symbols_reruns_every_remaining_test(
    tmp_path: Path, release_repo: tuple[GitRepo, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the file limit (a vendor drop, years of history) helpers are not compared one by
    one: every test still there counts as changed, and the note says why."""
    from test_selection import change_analysis
    from test_selection.upgrade.spec_impact import plan_upgrade

    repo, a, b = release_repo
    monkeypatch.setattr(change_analysis, "MAX_FILES", 1)
    plan = plan_upgrade(repo.path, a, b, [_spec(tmp_path)])
    assert any("too many to compare" in note for note in plan.diff.notes)
    kinds = {c.test.split("::")[-1]: c.kind for c in plan.diff.changes}
    assert kinds["test_flatten"] == "dependencies" and kinds["test_untouched"] == "dependencies"
    assert len(plan.diff.needing_run()) == plan.diff.tests_at_head
