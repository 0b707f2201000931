"""A fourth backend from a declaration alone (issue 36, item 3): a device the test writes
(PrivateUse1 registered as ``toydev``, running on the CPU), its declaration in a folder the
policy names, its runner image built from the declaration, and the bundled specs run
through the relay: a webhook in, shards in containers on ``toydev``, its column on the
dashboard, its CRCR report. No file of ci-relay is written or edited for it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ci_relay.context import RelayContext
from ci_relay.reporting.build import load_facts, render_callback
from ci_relay.reporting.wire import MAX_SEND_BYTES
from ci_relay.sample_upstream import SampleUpstream
from ci_relay.service.app import create_app
from ci_relay.settings import Settings
from ci_relay.steps import Next
from ci_relay.store.models import OutboxMessage, Run, TestResult
from reuse_specs.backends import remove_backends_dir
from tests.gitrepo import GitRepo
from tests.relay_fixtures import SECRET, drain, post_webhook, pull_request

ROOT = Path(__file__).resolve().parent.parent

# The device: spyre_emu's Python PrivateUse1 machinery (installed with ci-relay in every
# runner image) under another device name. Only the name differs; that is what is tested.
DEVICE = '''\
"""toydev: a toy PrivateUse1 device on the CPU (ci-relay's declared-backend test)."""

import spyre_emu.device as _device

_device.NAME = "toydev"

from spyre_emu import load  # noqa: E402

__all__ = ["load"]
'''

TEST_BASE = """\
import toydev

from reuse_specs.devices.spyre_test_class import spyre_test_class

toydev.load()
TEST_CLASS = spyre_test_class()
"""

DECLARATION = """\
name: toydev
description: a toy PrivateUse1 device on the CPU
device_type: toydev
test_env:
  torch_test_devices: toydev_test_base.py
  device_only_for: privateuse1
processes_per_device: 1
preflight:
  modules:
    - module: toydev
      message: the toydev backend needs the toydev package (its runner image has it)
    - torch
image:
  packages: [torch==2.13.0, toydev]
  wheels: wheels
  env: {TOYDEV_IMAGE: "1"}
  check: |
    import toydev, torch
    toydev.load()
    x = torch.ones(2, dtype=torch.float16, device="toydev")
    assert str((x + x).device) == "toydev:0" and (x + x).cpu().tolist() == [2.0, 2.0]
"""


def write_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``files`` (path in the wheel -> text), written directly: no
    build backend is needed offline."""
    info = f"{name}-{version}.dist-info"
    contents = dict(files)
    contents[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    contents[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: ci-relay-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            archive.writestr(zipfile.ZipInfo(path, (1980, 1, 1, 0, 0, 0)), text)
    return wheel


@dataclass
class ToyRun:
    rt: RelayContext
    client: TestClient
    run_id: int


@pytest.fixture(scope="module")
def toy_run(
    sample_upstream: SampleUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToyRun]:
    tmp = tmp_path_factory.mktemp("toydev")
    backends = tmp / "backends"
    backends.mkdir()
    (backends / "toydev.yaml").write_text(DECLARATION)
    (backends / "toydev_test_base.py").write_text(TEST_BASE)
    write_wheel(backends / "wheels", "toydev", "0.1", {"toydev/__init__.py": DEVICE})
    policy = tmp / "policy.yaml"
    policy.write_text(
        f"backends_dir: {backends}\n"
        "repositories:\n  sample/pytorch:\n    backends:\n      toydev: {level: L2}\n"
    )
    # the image, from the declaration, as an operator builds it: the policy names the folder
    env = {k: v for k, v in os.environ.items() if not k.startswith("CI_RELAY_")}
    env["CI_RELAY_POLICY_FILE"] = str(policy)
    if os.environ.get("CI_RELAY_IMAGE_WORK"):
        env["CI_RELAY_IMAGE_WORK"] = os.environ["CI_RELAY_IMAGE_WORK"]
    built = subprocess.run(
        [sys.executable, "-m", "ci_relay", "images", "build"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=1800,
    )
    assert built.returncode == 0, built.stderr + built.stdout
    assert "localhost/ci-relay-runner-toydev:src-" in built.stdout

    subprocess.run(["git", "clone", "-q", str(sample_upstream.path), str(tmp / "up")], check=True)
    repo = GitRepo(tmp / "up")
    rt = RelayContext(
        Settings(
            database_url=f"sqlite:///{tmp / 'relay.db'}",
            data_dir=tmp / "data",
            webhook_secret=SECRET,  # type: ignore[arg-type]
            policy_file=policy,
            upstream_repo=str(repo.path),
            selection_agent="none",
            selection_budget="all",
            runtime="container",
            device_lock_dir=tmp / "locks",
            triage_max_tests=0,
            crcr_callback_url="http://127.0.0.1:9/crcr",
        )
    )
    rt.db.upgrade()
    steps: list[Next] = []
    try:
        with TestClient(create_app(rt, steps.extend)) as client:
            post_webhook(client, "pull_request", pull_request(repo, 36))
            drain(rt, steps)
            with rt.db.session() as s:
                run_id = s.scalars(select(Run.id)).one()
            yield ToyRun(rt, client, run_id)
    finally:
        rt.db.dispose()
        remove_backends_dir(backends)


@pytest.mark.container
@pytest.mark.slow
def test_the_declared_backend_runs_the_bundled_specs_in_its_container(toy_run: ToyRun) -> None:
    with toy_run.rt.db.session() as s:
        run = s.get(Run, toy_run.run_id)
        assert run is not None
        assert (run.backend, run.state) == ("toydev", "completed"), run.error
        assert run.shards and all(sh.runtime == "container" for sh in run.shards)
        results = s.scalars(select(TestResult)).all()
        nodeids = [r.nodeid for r in results]
        outcomes = {r.outcome for r in results}
    assert nodeids, "no result"
    on_device = [n for n in nodeids if "TOYDEV::" in n]
    assert on_device and all(n.split("::")[-1].split("_")[-2:][0] != "cpu" for n in on_device)
    assert any("_toydev" in n for n in on_device), on_device[:5]
    assert "passed" in outcomes
    assert not any("CPU::" in n for n in nodeids)  # never the CPU instead


@pytest.mark.container
@pytest.mark.slow
def test_the_dashboard_has_its_column_and_crcr_its_report(toy_run: ToyRun) -> None:
    grid = toy_run.client.get("/api/grid").json()
    assert grid["backends"] == ["toydev"]
    assert grid["rows"][0]["cells"]["toydev"]["run_id"] == toy_run.run_id
    page = toy_run.client.get(f"/runs/{toy_run.run_id}")
    assert page.status_code == 200 and "toydev" in page.text
    with toy_run.rt.db.session() as s:
        targets = {m.target for m in s.scalars(select(OutboxMessage)).all()}
        facts = load_facts(s, toy_run.run_id, with_failures=True)
    assert "crcr" in targets
    callback = json.loads(render_callback(facts, toy_run.rt.settings, "completed", MAX_SEND_BYTES))
    assert "toydev" in json.dumps(callback["workflow"])
