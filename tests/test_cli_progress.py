"""Long commands show their progress on a terminal and stay quiet in a log (issue 56, item
6): ``coverage record`` draws a bar of tests run from the recorder's progress file, ``images
build`` a spinner on its newest step. Real pytest runs, the real CLI, a real pseudo-terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ci_relay.cli.follow import follow_steps
from tests.conftest import CliResult
from tests.gitrepo import GitRepo

COUNT = 24
SLOW = "import time\nfrom pkg.core import inc\n\n" + "".join(
    f"def test_{i:02d}():\n    time.sleep(0.1)\n    assert inc({i}) == {i + 1}\n"
    for i in range(COUNT)
)


def _upstream(tmp_path: Path, tests: str = SLOW) -> GitRepo:
    repo = GitRepo(tmp_path / "up")
    repo.commit(
        "base",
        {"pkg/__init__.py": "", "pkg/core.py": "def inc(x):\n    return x + 1\n",
         "tests/test_core.py": tests},
        dedent=False,
    )  # fmt: skip
    return repo


def test_the_recorder_appends_tests_run_and_collected(tmp_path: Path) -> None:
    """``done total`` lines, never going back, the last one the whole run."""
    repo = _upstream(tmp_path)
    progress = tmp_path / "progress"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "test_selection.coverage_recorder",
         "--record-coverage", str(tmp_path / "map.json.gz"), "--coverage-progress",
         str(progress), "-p", "no:cacheprovider"],
        cwd=repo.path, env={**os.environ, "PYTHONPATH": str(repo.path)}, check=True,
        capture_output=True,
    )  # fmt: skip
    rows = [tuple(map(int, line.split())) for line in progress.read_text().splitlines()]
    assert rows[0] == (0, COUNT) and rows[-1] == (COUNT, COUNT)
    done = [d for d, _ in rows]
    assert done == sorted(done) and len(set(done)) > 2  # it moved during the run, not once


def _on_terminal(command: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``command`` with a pseudo-terminal as its standard output and error: its exit
    code and everything it drew."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm"}
    proc = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower,
                            stderr=follower, env=env)  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 1)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the other side closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(leader)
    return proc.wait(), b"".join(chunks).decode(errors="replace")


def test_coverage_record_draws_a_bar_on_a_terminal_and_a_summary_in_a_log(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo = _upstream(tmp_path)
    code, drawn = _on_terminal(
        [sys.executable, "-m", "ci_relay", "coverage", "record", "--upstream", str(repo.path),
         "-o", str(tmp_path / "tty.json.gz")],
        tmp_path,
    )  # fmt: skip
    assert code == 0, drawn
    counts = {int(m) for m in re.findall(rf"(\d+)/{COUNT}\b", drawn)}
    assert COUNT in counts and len(counts) > 2, drawn  # the bar moved as the tests ran
    assert f"recorded {COUNT} test(s)" in drawn
    # in a log: no bar, pytest's own summary once, and the dots of a quiet pytest are gone
    logged = cli("coverage", "record", "--upstream", repo.path, "-o", tmp_path / "log.json.gz")
    assert logged.code == 0, logged.output
    assert f"/{COUNT}" not in logged.output and "." * COUNT not in logged.output
    assert re.search(rf"pytest: {COUNT} passed in [\d.]+s", logged.output), logged.output


def test_coverage_record_shows_what_pytest_said_when_tests_fail(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """A failing test still gives a map (the recording is of what ran) and its name is shown;
    a run that collected nothing shows pytest's own words, and no map is written."""
    failing = "from pkg.core import inc\n\ndef test_ok():\n    assert inc(1) == 2\n\n" \
        "def test_wrong():\n    assert inc(1) == 3\n"  # fmt: skip
    repo = _upstream(tmp_path, failing)
    out = tmp_path / "map.json.gz"
    failed = cli("coverage", "record", "--upstream", repo.path, "-o", out)
    assert failed.code == 0, failed.output
    assert "pytest exit 1; its last lines:" in failed.output
    assert "FAILED tests/test_core.py::test_wrong" in failed.output
    assert out.is_file()
    nothing = cli("coverage", "record", "--upstream", repo.path, "-o", tmp_path / "none.json.gz",
                  "--", "-k", "no_such_test")  # fmt: skip
    assert nothing.code == 1 and "pytest: 2 deselected in" in nothing.output, nothing.output
    assert not (tmp_path / "none.json.gz").exists()


def test_a_build_script_s_steps_are_printed_and_its_exit_code_kept(
    tmp_path: Path, capfd: object
) -> None:
    script = tmp_path / "steps.sh"
    script.write_text("echo 'images: one' >&2\necho 'images: two' >&2\nexit 3\n")
    assert follow_steps(["bash", str(script)], "images build") == 3
    said = capfd.readouterr().err  # type: ignore[attr-defined]
    assert said.index("images: one") < said.index("images: two")
