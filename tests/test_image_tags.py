"""Runner images are pinned by the digest of the ci-relay sources they run (issue 27, item 3):
a worker asks for the image of its own sources and refuses, naming the command, one built
from other sources; nothing on the run path asks for ``:latest``."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ci_relay.execution.runtimes import PODMAN_SOCKET, RuntimeUnavailable
from ci_relay.execution.runtimes.container import ContainerRuntime
from ci_relay.source_digest import TAG_PREFIX, input_digest, own_image_tag, source_digest

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_tag_follows_the_sources_and_nothing_else(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for package in ("ci_relay", "reuse_specs", "spyre_emu", "test_selection"):
        shutil.copytree(
            REPO_ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    first = source_digest(tree)
    assert first == source_digest(REPO_ROOT)  # the same files, wherever they are
    assert own_image_tag() == TAG_PREFIX + source_digest(REPO_ROOT)
    # bytecode, notes and the sample upstream's commit data do not change what runs
    (tree / "ci_relay" / "__pycache__").mkdir(exist_ok=True)
    (tree / "ci_relay" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (tree / "spyre_emu" / "NOTES.txt").write_text("notes")
    commits = tree / "ci_relay" / "sample_upstream" / "commits"
    (commits / "extra.py").write_text("x = 1\n")
    assert source_digest(tree) == first
    # a module or a data file the runner reads does
    module = tree / "reuse_specs" / "matching.py"
    module.write_text(module.read_text() + "\n# changed\n")
    assert source_digest(tree) != first
    module.write_text(module.read_text().removesuffix("\n# changed\n"))
    assert source_digest(tree) == first
    (tree / "spyre_emu" / "default_profile.yaml").write_text("name: other\n")
    assert source_digest(tree) != first


def test_the_build_inputs_cover_every_file_an_image_build_reads(tmp_path: Path) -> None:
    """`images build` skips resolving wheels when this digest is unchanged, so it must move
    with anything the wheels or images are made from, not only with what runners execute."""
    tree = tmp_path / "tree"
    for package in ("ci_relay", "reuse_specs", "spyre_emu", "test_selection"):
        shutil.copytree(
            REPO_ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(REPO_ROOT / "pyproject.toml", tree / "pyproject.toml")
    first, source = input_digest(tree), source_digest(tree)
    assert first == input_digest(REPO_ROOT)
    (tree / "ci_relay" / "__pycache__").mkdir(exist_ok=True)
    (tree / "ci_relay" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert input_digest(tree) == first
    # a dashboard template: in the relay image, not run by a runner
    template = tree / "ci_relay" / "dashboard" / "templates" / "run.html"
    template.write_text(template.read_text() + "<!-- changed -->")
    assert source_digest(tree) == source and input_digest(tree) != first
    template.write_text(template.read_text().removesuffix("<!-- changed -->"))
    assert input_digest(tree) == first
    # a dependency range: what the wheels resolve to
    project = tree / "pyproject.toml"
    project.write_text(project.read_text().replace("httpx>=", "httpx>=0.0.1,", 1))
    assert input_digest(tree) != first


def test_nothing_on_the_run_path_asks_for_latest() -> None:
    found = [
        f"{path.relative_to(REPO_ROOT)}:{n}"
        for path in sorted((REPO_ROOT / "ci_relay").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"ci-relay-runner-[^\"']*:latest", line)
    ]
    assert found == []
    assert ContainerRuntime("cpu").image == f"localhost/ci-relay-runner-cpu:{own_image_tag()}"


@pytest.mark.container
def test_a_worker_refuses_an_image_built_from_other_sources() -> None:
    """`images build` (run by .ci/run) tagged the runner with these sources' digest, so the
    worker's own image is there; asked for other sources, the same engine says what it has
    and which command builds the right one."""
    ContainerRuntime("cpu", PODMAN_SOCKET).check()  # the image of this checkout exists
    other = ContainerRuntime("cpu", PODMAN_SOCKET, tag=TAG_PREFIX + "0" * 16)
    with pytest.raises(RuntimeUnavailable) as info:
        other.check()
    message = str(info.value)
    assert (
        f"runner image localhost/ci-relay-runner-cpu:{TAG_PREFIX}{'0' * 16} is missing" in message
    )
    assert f"exists only as {own_image_tag()}" in message
    assert "built from other ci-relay sources" in message
    assert "`ci-relay images build --backend cpu`" in message
