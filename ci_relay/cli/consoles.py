"""The command line's two consoles (standard output and standard error).

On a terminal, Rich wraps long lines to its width; anywhere else (a CI log, a pipe, a file)
a line is written whole, so a URL or a path printed by any command can be copied as it is.
"""

from __future__ import annotations

import sys

from rich.console import Console


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    on_terminal = stream is not None and stream.isatty()
    return Console(stderr=stderr, highlight=False, soft_wrap=not on_terminal)


out = console()
err = console(stderr=True)
