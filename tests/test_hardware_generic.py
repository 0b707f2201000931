"""Hardware-generic tests (a plain ``TestCase`` class: no device parameter) under a device
backend, as torch-spyre's framework treats them: skipped before the body runs, unless a spec
lists them, and then they run on the CPU with a note that says so (in the result, the JUnit
file, the run summary and the dashboard); ``specs check`` warns about such listings; a class's
``hw_classification`` decides when it has one. On ``spyre-emu``."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay.context import RelayContext
from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import Run, TestResult
from reuse_specs.pytest_plugin import CPU_NOTE, HARDWARE_GENERIC
from tests.conftest import CliResult
from tests.relay_fixtures import drain, post_webhook, upstream_context

UPSTREAM = """\
import enum

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase, run_tests


class HardwareClassification(enum.Enum):
    GENERIC = "generic"
    DEVICE = "device"


class TestOnDevice(TestCase):
    def test_add(self, device):
        self.assertEqual(torch.ones(2, device=device).sum().item(), 2.0)


class TestPlain(TestCase):
    def test_listed(self):
        self.assertEqual(torch.ones(2).sum().item(), 2.0)

    def test_unlisted(self):
        self.assertEqual(torch.ones(2).sum().item(), 2.0)


class TestTaggedDevice(TestCase):
    hw_classification = HardwareClassification.DEVICE

    def test_tagged(self):
        self.assertTrue(True)


class TestTaggedGeneric(TestCase):
    hw_classification = HardwareClassification.GENERIC

    def test_generic(self):
        self.assertTrue(True)


instantiate_device_type_tests(TestOnDevice, globals())

if __name__ == "__main__":
    run_tests()
"""
SPEC = """\
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_hw.py
      unlisted_test_mode: mandatory_success
      tests:
        - names: [TestPlain::test_listed]
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hw") / "upstream"
    (root / "test").mkdir(parents=True)
    (root / "test" / "test_hw.py").write_text(UPSTREAM)
    (root.parent / "spec.yaml").write_text(SPEC)
    return root


def _emu_env(tmp_path: Path) -> dict[str, str]:
    return {"SPYRE_EMU_LOCK_DIR": str(tmp_path)}  # its own emulated card


def _cases(junit: Path) -> dict[str, tuple[str, str, dict[str, str]]]:
    """test name -> (result, skip/failure message, properties)."""
    out = {}
    for case in ET.parse(junit).iter("testcase"):
        verdict = [c for c in case if c.tag in ("failure", "error", "skipped")]
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        out[case.get("name", "")] = (
            verdict[0].tag if verdict else "passed",
            verdict[0].get("message", "") if verdict else "",
            props,
        )
    return out


@pytest.mark.parametrize("runtime", [None, "sandbox"])
def test_under_spyre_emu_plain_tests_skip_unless_listed(
    cli: Callable[..., CliResult], tree: Path, tmp_path: Path, runtime: str | None
) -> None:
    junit = tmp_path / "junit.xml"
    args = ["run", "--spec", str(tree.parent / "spec.yaml"), "--upstream", str(tree)]
    args += ["--backend", "spyre-emu", "--junit", str(junit)]
    args += ["--runtime", runtime] if runtime else []
    result = cli(*args, env=_emu_env(tmp_path))
    assert result.code == 0, result.output
    cases = _cases(junit)
    assert cases["test_add_spyre"][0] == "passed"
    assert cases["test_unlisted"][0] == "skipped"
    assert HARDWARE_GENERIC in cases["test_unlisted"][1]
    assert cases["test_generic"][0] == "skipped"  # tagged GENERIC: the tag decides
    assert cases["test_tagged"][0] == "passed"  # tagged for devices: runs as before
    listed = cases["test_listed"]
    assert listed[0] == "passed" and listed[2].get("reuse_spec.note") == CPU_NOTE
    assert "reuse_spec.note" not in cases["test_add_spyre"][2]
    assert f"NOTE 1 test variant(s) {CPU_NOTE}" in result.stdout


def test_on_the_cpu_backend_nothing_changes(
    cli: Callable[..., CliResult], tree: Path, tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    result = cli(
        "run", "--spec", tree.parent / "spec.yaml", "--upstream", tree, "--junit", junit,
        env=_emu_env(tmp_path),
    )  # fmt: skip
    assert result.code == 0, result.output
    cases = _cases(junit)
    assert {name: c[0] for name, c in cases.items()} == {
        "test_add_cpu": "passed",
        "test_listed": "passed",
        "test_unlisted": "passed",
        "test_tagged": "passed",
        "test_generic": "passed",
    }
    assert not any("reuse_spec.note" in c[2] for c in cases.values())


def test_specs_check_warns_about_listed_plain_tests(
    cli: Callable[..., CliResult], tree: Path
) -> None:
    result = cli("specs", "check", tree.parent / "spec.yaml", "--upstream", tree)
    assert result.code == 0, result.output
    warnings = [line for line in result.stdout.splitlines() if ": warning: " in line]
    assert len(warnings) == 1
    assert "'TestPlain::test_listed' names a hardware-generic test (TestPlain" in warnings[0]
    assert warnings[0].startswith(f"{tree.parent / 'spec.yaml'}:6:")


@pytest.fixture(scope="module")
def relayed(
    tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestClient, RelayContext]]:
    tmp = tmp_path_factory.mktemp("hw-relay")
    repo = tmp / "upstream"
    subprocess.run(["cp", "-r", str(tree), str(repo)], check=True)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    (repo / "test" / "test_hw.py").write_text(UPSTREAM + "\n# a change\n")
    subprocess.run([*git, "commit", "-qam", "change"], cwd=repo, check=True)
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD", "HEAD~1"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split()
    # the test's own upstream: running it unisolated is a person's choice, as the settings say
    rt = upstream_context(tmp, repo, SPEC, backends=("spyre-emu",), runtime="local")
    steps: list[Next] = []
    payload = {
        "action": "opened",
        "number": 17,
        "pull_request": {
            "number": 17,
            "head": {"sha": sha[0], "ref": "pr-17"},
            "base": {"sha": sha[1], "ref": "main"},
            "labels": [],
        },
        "repository": {"full_name": "sample/pytorch"},
    }
    with TestClient(create_app(rt, steps.extend)) as client:
        post_webhook(client, "pull_request", payload)
        drain(rt, steps)
        yield client, rt
    rt.db.dispose()


def test_the_note_is_stored_and_the_dashboard_shows_a_badge(
    relayed: tuple[TestClient, RelayContext],
) -> None:
    client, rt = relayed
    with rt.db.session() as s:
        assert s.scalars(select(Run.state)).one() == "completed"
        notes = dict(s.execute(select(TestResult.nodeid, TestResult.note)).all())
    assert notes["test/test_hw.py::TestPlain::test_listed"] == CPU_NOTE
    assert notes["test/test_hw.py::TestOnDeviceSPYRE::test_add_spyre"] is None
    run = client.get("/api/grid").json()
    run_ids = [c["run_id"] for row in run["rows"] for c in row["cells"].values()]
    assert len(run_ids) == 1
    page = client.get(f"/runs/{run_ids[0]}")
    assert page.status_code == 200
    assert 'class="badge cpu-only"' in page.text and "1 on CPU" in page.text
    view = client.get(f"/api/runs/{run_ids[0]}/view").json()
    assert [shard["cpu_only"] for shard in view["run"]["shards"]] == [1]
    raw = client.get(f"/api/runs/{run_ids[0]}").json()
    noted = [r for shard in raw["shards"] for r in shard["results"] if r["note"]]
    assert [r["nodeid"] for r in noted] == ["test/test_hw.py::TestPlain::test_listed"]
