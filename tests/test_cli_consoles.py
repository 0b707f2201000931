"""Output that is not going to a terminal is never wrapped (issue 56, item 6): a path or a
URL in a CI log or a pipe can be copied whole. The real command line, in a subprocess whose
output is a pipe."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import CliResult


def test_a_long_path_in_an_error_stays_on_one_line_in_a_pipe(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    missing = tmp_path / ("a-long-folder-name-" * 8) / "missing.json.gz"
    done = cli("coverage", "show", missing)
    assert done.code != 0
    lines = [line for line in done.output.splitlines() if "missing.json.gz" in line]
    assert lines == [f"error: {missing}: no such coverage map"], done.output
