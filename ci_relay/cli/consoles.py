"""The command line's two consoles (standard output and standard error).

On a terminal, Rich wraps long lines to its width; anywhere else (a CI log, a pipe, a file)
a line is written whole, so a URL or a path printed by any command can be copied as it is.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    on_terminal = stream is not None and stream.isatty()
    return Console(stderr=stderr, highlight=False, soft_wrap=not on_terminal)


out = console()
err = console(stderr=True)


def counting_bar(*, transient: bool = False, auto_refresh: bool = True) -> Progress:
    """The bar long commands draw on standard error (``run``'s tests, ``coverage record``'s):
    a spinner, what is under way, the bar, done of total, the time spent."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=transient,
        auto_refresh=auto_refresh,
    )
