"""Long child processes shown as they go: ``coverage record``'s pytest run (a bar drawn from
the recorder's progress file) and ``images build``'s script (a spinner on its latest step).

On a terminal the display is live. In a CI log or a pipe Rich draws nothing live, so the log
gets what matters once: the pytest run's summary line, or its last lines when it did not
pass; the build script's step lines as they come.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ci_relay.cli.consoles import counting_bar, err

POLL_SECONDS = 0.25  # how often the child's progress file is read
TAIL_LINES = 30  # what a failed pytest run shows of its output


@dataclass
class Followed:
    """How a followed pytest run ended, and what it printed."""

    code: int
    seconds: float
    output: str
    timed_out: bool = False

    def summary(self) -> str:
        """pytest's closing line (``12 passed in 3.10s``), or "" when it printed none."""
        lines = [line.strip(" =") for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def tail(self, count: int = TAIL_LINES) -> str:
        return "\n".join(self.output.rstrip().splitlines()[-count:])


def _last_counts(text: str) -> tuple[int, int] | None:
    """The newest complete ``done total`` line of a progress file's new text."""
    for line in reversed(text.splitlines()):
        parts = line.split()
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            return int(parts[0]), int(parts[1])
    return None


def follow_pytest(
    command: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    scratch: Path,
    label: str,
) -> Followed:
    """Run pytest with the recorder's ``--coverage-progress`` file, its output kept in
    ``scratch``; a bar of tests run against tests collected until it ends. A run past
    ``timeout`` seconds is killed (``timed_out``)."""
    log = scratch / "pytest.log"
    progress_file = scratch / "progress"
    progress_file.touch()
    bar = counting_bar(transient=True)
    task = bar.add_task(f"{escape(label)}: collecting", total=None)
    start = time.monotonic()
    timed_out = False
    with log.open("wb") as sink, progress_file.open("rb") as counts, bar:
        proc = subprocess.Popen(
            # one token: an existing path given apart would be read as a test path while
            # pytest finds its rootdir, before the plugin's options are known
            [*command, f"--coverage-progress={progress_file}"],
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            while proc.poll() is None:
                if time.monotonic() - start > timeout:
                    timed_out = True
                    proc.kill()
                    proc.wait()
                    break
                time.sleep(POLL_SECONDS)
                seen = _last_counts(counts.read().decode(errors="replace"))
                if seen is not None:
                    done, total = seen
                    bar.update(task, completed=done, total=total or None,
                               description=f"{escape(label)}: recording")  # fmt: skip
        except BaseException:  # Ctrl-C: the tests stop with the command
            proc.kill()
            proc.wait()
            raise
    output = log.read_bytes().decode(errors="replace")
    return Followed(proc.returncode, time.monotonic() - start, output, timed_out)


def follow_steps(command: Sequence[str], label: str) -> int:
    """Run a script that reports its steps on standard error, one line each: every line is
    printed as it comes, and on a terminal a spinner under them names the newest step and
    the time spent. Its exit code."""
    spinner = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
        console=err, transient=True,
    )  # fmt: skip
    task = spinner.add_task(f"{escape(label)}…", total=None)
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace")
    assert proc.stderr is not None
    with spinner:
        try:
            for line in proc.stderr:
                step = line.rstrip("\n")
                spinner.console.print(escape(step), soft_wrap=True)
                now = escape(step.removeprefix("images: "))
                spinner.update(task, description=f"{escape(label)}: {now}")
        except BaseException:  # Ctrl-C: the build stops with the command
            proc.kill()
            raise
        finally:
            proc.wait()
    return proc.returncode
