"""torch-spyre's tier ladder (issue 56, item 3): a run of one tier takes that tier and those
below it, old tier names read as their new ones, ``specs check`` names the old names and a
config without labels (CHECK 0; ``--strict`` fails on them), ``specs fix-labels`` rewrites
the old names keeping everything else byte for byte, and a label in no ladder that no spec
carries is refused. On torch-spyre's own configs (``tests/data/torch-spyre/``, sources named
there) and on configs written with the old names."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ci_relay.sample_upstream import SampleUpstream
from reuse_specs.tiers import covered, label_notes, rename_old_labels, selects
from tests.conftest import CliResult

DATA = Path(__file__).parent / "data" / "torch-spyre"
NEW_STYLE = DATA / "example_test_config.yaml"  # labels: [regression]
UNLABELLED = DATA / "nn-test_init.yaml"  # no labels at all
OLD_STYLE = """\
# a config from before the rename
test_suite_config:
  labels: [core, "full"]   # the suite's tiers
  files:
    - path: ${TORCH_ROOT}/test/test_view_ops.py
      unlisted_test_mode: skip
      labels:
        - device_critical  # this file's
      tests:
        - names: [TestViewOps::test_unsqueeze_view]
          labels: ['full', nightly]
"""


def test_a_tier_covers_itself_and_every_tier_below_under_either_name() -> None:
    assert covered("integration") == {
        "smoke", "unit", "integration", "core", "device_critical",
    }  # fmt: skip
    assert covered("full") == covered("regression")  # an old name reads as its new one
    assert selects("regression", ["smoke"]) and selects("unit", ["core"])
    assert not selects("unit", ["regression"]) and not selects("smoke", ["unit"])
    assert covered("nightly") == {"nightly"}  # a team's own label: itself alone
    assert selects("trunk", ["full"]) and not selects("trunk", ["nightly"])


def test_fix_labels_rewrites_only_the_old_names(tmp_path: Path) -> None:
    new, done = rename_old_labels(OLD_STYLE)
    assert done == [
        (3, "core", "unit"),
        (3, "full", "regression"),
        (8, "device_critical", "integration"),
        (11, "full", "regression"),
    ]
    expected = (
        OLD_STYLE.replace('[core, "full"]', '[unit, "regression"]')
        .replace("- device_critical  #", "- integration  #")
        .replace("['full', nightly]", "['regression', nightly]")
    )
    assert new == expected  # comments, quoting, layout: byte for byte
    assert rename_old_labels(new) == (new, [])


def test_check_names_old_tiers_and_check_0_and_strict_fails_on_them(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    old = tmp_path / "old.yaml"
    old.write_text(OLD_STYLE)
    done = cli("specs", "check", old)
    assert done.code == 0, done.output
    assert f"{old}:3: note: label 'core' is the old name of tier 'unit'" in done.stdout
    assert f"{old}:8: note: label 'device_critical' is the old name of tier 'integration'" in (
        done.stdout
    )
    assert "label 'nightly' is in no tier ladder" in done.stdout
    strict = cli("specs", "check", "--strict", old)
    assert strict.code == 1
    assert f"{old}:3: error: label 'core'" in strict.stdout
    assert "4 label error(s)" in strict.stderr  # the team's own label stays a note
    # torch-spyre's own configs: the new label set passes strict; the one without labels is
    # its CHECK 0
    assert cli("specs", "check", "--strict", NEW_STYLE).code == 0
    loose = cli("specs", "check", UNLABELLED)
    assert loose.code == 0 and "note: CHECK 0: Labels: the config has no labels" in loose.stdout
    failed = cli("specs", "check", "--strict", UNLABELLED)
    assert failed.code == 1 and "error: CHECK 0: Labels" in failed.stdout
    assert not label_notes(NEW_STYLE.read_text())


def test_the_fix_command_rewrites_in_place_and_check_mode_changes_nothing(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "old.yaml").write_text(OLD_STYLE)
    (folder / "new.yaml").write_text(NEW_STYLE.read_text())
    dry = cli("specs", "fix-labels", "--check", folder)
    assert dry.code == 1 and "1 of 2 spec file(s) would change" in dry.stdout
    assert (folder / "old.yaml").read_text() == OLD_STYLE
    done = cli("specs", "fix-labels", folder)
    assert done.code == 0, done.output
    assert f"{folder / 'old.yaml'}:8: device_critical -> integration" in done.stdout
    assert (folder / "old.yaml").read_text() == rename_old_labels(OLD_STYLE)[0]
    assert (folder / "new.yaml").read_text() == NEW_STYLE.read_text()
    assert cli("specs", "check", "--strict", folder / "old.yaml").code == 0
    bad = folder / "latin1.yaml"
    bad.write_bytes("test_suite_config:\n  labels: [core]  # caf\xe9\n".encode("latin-1"))
    refused = cli("specs", "fix-labels", bad)
    assert refused.code == 2 and "cannot read it as UTF-8" in refused.stderr
    assert bad.read_bytes().endswith(b"caf\xe9\n")  # nothing lost


@pytest.mark.parametrize("how", ["--label", "TORCH_SPYRE_TEST_TYPE"])
def test_a_run_of_a_tier_takes_the_tiers_below_and_an_unknown_label_is_refused(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream, tmp_path: Path, how: str
) -> None:
    spec = tmp_path / "old.yaml"
    spec.write_text(OLD_STYLE)

    def show(label: str) -> CliResult:
        args = ["specs", "show", spec, "--upstream", sample_upstream.path, "--json"]
        if how == "--label":
            return cli(*args, "--label", label)
        return cli(*args, env={"TORCH_SPYRE_TEST_TYPE": label})

    def ran(done: CliResult) -> set[str]:
        assert done.code == 0, done.output
        return {v["test"] for v in json.loads(done.stdout) if v["mode"] != "skip"}

    # the test entry is labelled full (regression) and nightly; its file device_critical
    assert any(n.startswith("test_unsqueeze_view") for n in ran(show("trunk")))
    if how == "--label":  # the variable reads the same: one collection each is enough there
        assert any(n.startswith("test_unsqueeze_view") for n in ran(show("regression")))
        assert not ran(show("integration"))  # below regression: the entry is not in it
        assert any(n.startswith("test_unsqueeze_view") for n in ran(show("nightly")))
    refused = show("nightlyy")
    assert refused.code == 2
    assert "label 'nightlyy' is not a tier" in refused.stderr
    assert "no spec entry carries it" in refused.stderr
