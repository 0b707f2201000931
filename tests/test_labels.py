"""Spec labels choose which entries run, as ``TORCH_SPYRE_TEST_TYPE`` does in torch-spyre:
``--label`` on the commands that read specs, the variable as its default, in-process and
in an isolated shard, and a label per backend in the relay's policy (the selection's
universe and the shards both follow it). All on ``spyre-emu``."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay.policy import Policy, PolicyError, load_policy
from ci_relay.sample_upstream import SampleUpstream
from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import Run
from tests.conftest import BUNDLED_SPECS, CliResult
from tests.relay_fixtures import drain, post_webhook, upstream_context
from tests.test_run import _junit

VIEW_SPEC = BUNDLED_SPECS / "spyre_view_ops.yaml"  # test_view_shares_storage: labels [trunk]
LABELLED = """\
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_view_ops.py
      unlisted_test_mode: mandatory_success
      tests:
        - names: [TestViewOps::test_unsqueeze_view]
          labels: [smoke]
"""


def _run(
    cli: Callable[..., CliResult],
    sample: SampleUpstream,
    junit: Path,
    *extra: str,
    env: dict[str, str] | None = None,
) -> CliResult:
    return cli("run", "--spec", VIEW_SPEC, "--upstream", sample.path, "--backend", "spyre-emu",
               "--junit", junit, *extra,
               env={"SPYRE_EMU_LOCK_DIR": str(junit.parent), **(env or {})})  # fmt: skip


def _skipped_for_label(junit: Path) -> set[str]:
    return {
        name
        for name, (result, props) in _junit(junit).items()
        if result == "skipped" and "label 'nightly'" in " ".join(props.get("reuse_spec.reason", []))
    }


@pytest.mark.parametrize("how", ["--label", "TORCH_SPYRE_TEST_TYPE"])
def test_the_label_or_the_variable_picks_the_entries(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream, tmp_path: Path, how: str
) -> None:
    everything = _run(cli, sample_upstream, tmp_path / "all.xml")
    assert everything.code == 0, everything.output
    assert _skipped_for_label(tmp_path / "all.xml") == set()
    if how == "--label":
        labelled = _run(cli, sample_upstream, tmp_path / "n.xml", "--label", "nightly")
    else:
        labelled = _run(
            cli, sample_upstream, tmp_path / "n.xml", env={"TORCH_SPYRE_TEST_TYPE": "nightly"}
        )
    assert labelled.code == 0, labelled.output
    skipped = _skipped_for_label(tmp_path / "n.xml")
    assert "test_view_shares_storage_spyre" in skipped  # its entry is labelled [trunk] only
    expand = [n for n in _junit(tmp_path / "n.xml") if n.startswith("test_expand_view_spyre")]
    assert expand and not skipped & set(expand)  # its entry is labelled [nightly]


def test_an_isolated_shard_follows_the_label(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    result = _run(
        cli,
        sample_upstream,
        tmp_path / "sandbox.xml",
        "--runtime",
        "sandbox",
        env={"TORCH_SPYRE_TEST_TYPE": "nightly"},
    )
    assert result.code == 0, result.output
    cases = {
        case.get("name", ""): " ".join(case.itertext()) + " ".join(str(c.attrib) for c in case)
        for case in ET.parse(tmp_path / "sandbox.xml").iter("testcase")
    }
    assert "label 'nightly'" in cases["test_view_shares_storage_spyre"]
    expand = [n for n in cases if n.startswith("test_expand_view_spyre")]
    assert expand and all("label 'nightly'" not in cases[n] for n in expand)


def test_the_policy_label_is_validated(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("repositories:\n  a/b:\n    backends:\n      spyre-emu: {label: smoke}\n")
    assert load_policy(good).label_for("a/b", "spyre-emu") == "smoke"
    assert load_policy(good).label_for("a/b", "cpu") is None
    assert Policy().label_for("a/b", "spyre-emu") is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("repositories:\n  a/b:\n    backends:\n      spyre-emu: {label: 'a b;rm'}\n")
    with pytest.raises(PolicyError, match="label"):
        load_policy(bad)


@pytest.fixture(scope="module")
def labelled_run(
    sample_upstream: SampleUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("labels")
    # the test's own upstream: running it unisolated is a person's choice, as the settings say
    rt = upstream_context(
        tmp,
        sample_upstream.path,
        LABELLED,
        backends=("cpu", "spyre-emu"),
        labels={"spyre-emu": "smoke"},
        runtime="local",
    )
    steps: list[Next] = []
    payload = {
        "action": "opened",
        "number": 3,
        "pull_request": {
            "number": 3,
            "head": {"sha": sample_upstream.head, "ref": "pr-3"},
            "base": {"sha": sample_upstream.commits[0].sha, "ref": "main"},
            "labels": [],
        },
        "repository": {"full_name": "sample/pytorch"},
    }
    with TestClient(create_app(rt, steps.extend)) as client:
        post_webhook(client, "pull_request", payload)
        drain(rt, steps)
    out: dict[str, Any] = {}
    with rt.db.session() as s:
        for run in s.scalars(select(Run)):
            out[run.backend] = {
                "state": run.state,
                "results": {r.nodeid: r.outcome for sh in run.shards for r in sh.results},
            }
    yield out
    rt.db.dispose()


def test_the_policy_label_bounds_what_the_backend_runs(labelled_run: dict[str, Any]) -> None:
    emu, cpu = labelled_run["spyre-emu"], labelled_run["cpu"]
    assert emu["state"] == cpu["state"] == "completed"
    assert emu["results"] and all("test_unsqueeze_view" in n for n in emu["results"]), emu
    assert all(outcome == "passed" for outcome in emu["results"].values())
    assert any("test_expand_view" in n for n in cpu["results"])  # cpu has no label: all run
