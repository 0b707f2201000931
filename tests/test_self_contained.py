"""The repository stands on its own: a clone with nothing beside it tests, runs and documents
itself. Two checks: no tracked file names a path outside the checkout (a ``../`` that climbs
out of it, a ``__file__`` chain that climbs past the root, an absolute path of one machine),
and the suite collects the same tests from a copy of the tracked files in an empty folder
(reads while it runs are caught by ``tests/outside_reads.py``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from tests.outside_reads import OutsideRead, OutsideReadGuard

ROOT = Path(__file__).resolve().parent.parent

# a relative path that starts with ../ (not the tail of a longer path, not "..."), and a
# folder of one machine (the project's scratch and mirror folders, a user's home)
CLIMB = re.compile(r"(?<![\w./$-])((?:\.\./)+)([\w.+-]*)")
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:work|home|Users)/[\w.+-]+")
HOME_PATH = re.compile(r"(?<![\w.~$-])/root/[\w.+-]+")
# Path(__file__)....parents[N] or .parent.parent...: where a module climbs to
FILE_CHAIN = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?(\.parents\[(\d+)\]|(?:\.parent\b)+)")
ROOT_PARENT = re.compile(r"\b(?:REPO_)?ROOT\.parent\b")
# bad-input tests hand traversal strings to the validators on purpose
TRAVERSAL_TESTS = frozenset(
    {"tests/fuzzing.py", "tests/test_intake_validation.py", "tests/test_real_tree.py"}
)
SELF = "tests/test_self_contained.py"  # its examples of what is caught


def tracked_files(root: Path) -> list[str]:
    """The checkout's files as a clone of it would have them: tracked, and new ones not
    ignored (about to be committed); every file when it is not a git checkout."""
    if (root / ".git").exists():
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        return sorted(name for name in out.decode().split("\0") if name)
    skip = {".git", ".ci-relay", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
    return sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if path.is_file() and not skip & set(path.relative_to(root).parts)
    )


def outside_references(name: str, text: str) -> list[str]:
    """Every place in one tracked file's text that points outside the checkout."""
    found = []
    depth = len(PurePosixPath(name).parent.parts)  # how far up __file__ may go
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{name}:{number}"
        if name not in TRAVERSAL_TESTS:
            for match in CLIMB.finditer(line):
                if line[: match.start()].endswith("$schema="):
                    continue  # a spec's schema line: relative to the spec (checked there)
                # commands and paths in this repository are written from its root
                found.append(f"{where}: {match.group(0)!r} climbs out of the checkout")
        for match in MACHINE_PATH.finditer(line):
            found.append(f"{where}: {match.group(0)!r} is a folder of one machine")
        if not name.startswith("docker/"):  # inside an image, /root is the image's
            for match in HOME_PATH.finditer(line):
                found.append(f"{where}: {match.group(0)!r} is a folder of one machine")
        if name.endswith(".py"):
            for match in FILE_CHAIN.finditer(line):
                up = int(match.group(2)) + 1 if match.group(2) else match.group(1).count(".parent")
                if up > depth + 1:  # .parent is the file's folder, one more per level
                    found.append(f"{where}: {match.group(0)!r} climbs out of the checkout")
            for match in ROOT_PARENT.finditer(line):
                found.append(f"{where}: {match.group(0)!r} is the folder beside the checkout")
    return found


def test_no_tracked_file_points_outside_the_checkout() -> None:
    problems = []
    for name in tracked_files(ROOT):
        if name == SELF:
            continue
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary, or deleted in the work tree
        problems += outside_references(name, text)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("README.md", "See `../shared/DESIGN.md` for the whole picture."),
        ("tests/x.py", 'FIXTURES = Path(__file__).resolve().parents[2] / "shared"'),
        ("bench/x.py", "ROOT = Path(__file__).resolve().parent.parent.parent"),
        ("bench/x.py", 'YARDSTICK = ROOT.parent / "shared" / "bench" / "select_eval.py"'),
        ("bench/x.py", "    git clone -q /work/.mirror/pytorch+rl/repo /work/scratch/rl"),
        ("tests/x.py", 'pytest.fail("expected in /home/me/shared/data next to this checkout")'),
        ("scripts/x.sh", "cp ../../other/file here"),
        ("bench/README.md", "`python3 ../shared/bench/select_eval.py --repo CLONE`"),
    ],
)
def test_each_way_out_is_caught(name: str, line: str) -> None:
    assert outside_references(name, line), line


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("reuse_specs/specs/a.yaml", "# yaml-language-server: $schema=../spec.schema.json"),
        (
            "reuse_specs/specs/pytorch/b.yaml",
            "# yaml-language-server: $schema=../../spec.schema.json",
        ),
        ("ci_relay/cli/images.py", "root = Path(__file__).resolve().parents[2]"),
        ("tests/conftest.py", "REPO_ROOT = Path(__file__).resolve().parent.parent"),
        ("README.md", "HUD's .../crcr/results endpoint; refs/heads/../x is refused"),
        ("docker/relay.Containerfile", " && rm -rf /wheelhouse /root/.cache \\"),
        ("README.md", "CI_RELAY_UPSTREAM_REPO=/srv/pytorch and $HOME/work/x"),
    ],
)
def test_what_stays_inside_is_not_flagged(name: str, line: str) -> None:
    assert outside_references(name, line) == []


def test_the_guard_refuses_a_read_beside_the_checkout(tmp_path: Path) -> None:
    """A process-wide hook cannot be removed, so the guard is tried on its own decision and
    through the hook function directly, on a layout like CI's (a sibling ``shared/``)."""
    checkout, sibling = tmp_path / "box" / "ci-relay", tmp_path / "box" / "shared"
    (checkout / "tests").mkdir(parents=True)
    sibling.mkdir()
    (sibling / "data.json").write_text("{}")
    guard = OutsideReadGuard(checkout)
    assert guard.active  # the temporary folder holds the box: it exempts nothing in it
    assert guard.offending(checkout / "tests" / "x.py") is None
    assert guard.offending(sibling / "data.json") == str(sibling / "data.json")
    assert guard.offending(os.fsencode(checkout / ".." / "shared")) == str(sibling)
    assert guard.offending(3) is None  # a file descriptor
    with pytest.raises(OutsideRead, match="outside the checkout"):
        guard.hook("open", (str(sibling / "data.json"), "r", 0))
    guard.hook("open", (str(checkout / "tests" / "x.py"), "r", 0))
    guard.hook("exec", (str(sibling),))  # events it does not watch pass
    assert guard.seen == [str(sibling / "data.json")]


def test_the_guard_stays_off_where_the_parent_is_the_machines(tmp_path: Path) -> None:
    """A clone straight in the temporary folder (or home) has the machine beside it."""
    import tempfile

    assert not OutsideReadGuard(Path(tempfile.gettempdir()) / "ci-relay").active
    assert not OutsideReadGuard(Path.home() / "ci-relay").active


def _plain_nodeid(item: pytest.Item) -> str:
    """The node id as a plain collection names it (xdist's loadgroup appends "@" and the
    item's group names, sorted and joined with "_")."""
    groups = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return item.nodeid.removesuffix("@" + "_".join(sorted(groups))) if groups else item.nodeid


def _collected(root: Path, env: dict[str, str]) -> tuple[int, set[str], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-o", "addopts="],
        cwd=root, capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    ids = {line for line in proc.stdout.splitlines() if "::" in line}
    return proc.returncode, ids, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow  # a whole collection in a child (torch imported): seconds, not the quick loop
def test_the_suite_collects_the_same_tests_from_a_lone_copy(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A copy of the tracked files in an empty folder collects every test this session
    collected: a module-level read of a sibling folder (an import error, or a glob that
    silently parametrizes nothing) would show here."""
    lone = tmp_path / "empty" / "ci-relay"
    for name in tracked_files(ROOT):
        source = ROOT / name
        if source.is_file():
            (lone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, lone / name)
    assert sorted(p.name for p in lone.parent.iterdir()) == ["ci-relay"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = str(lone)  # its packages, not the editable install's
    code, ids, output = _collected(lone, env)
    assert code == 0, output
    ours = {_plain_nodeid(item) for item in request.session.items}
    missing = sorted(ours - ids)
    assert not missing, f"{len(missing)} tests not collected from a lone copy: {missing[:20]}"
    assert f"tests/test_self_contained.py::{request.node.name}" in ids
