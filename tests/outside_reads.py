"""A guard that catches a test reading a file beside the checkout instead of inside it.

A user clones the repository alone: a file the suite reads from a sibling folder (CI has one
beside its clone) passes here and fails there. An audit hook sees every ``open``, ``listdir``
and ``scandir`` of this process; one that reaches into the checkout's parent folder but not into
the checkout is refused (``OutsideRead``) and remembered, so a test that swallows the error
still fails (``tests/conftest.py`` checks after each test).

It stays off when the parent folder holds the machine's own places (the clone sits directly in
the temporary folder or the home folder, or Python lives beside it): there a read beside the
checkout is the machine's business, not a sibling project's. Child processes are not watched;
``tests/test_self_contained.py`` covers them by reading every tracked file's text.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
from pathlib import Path

WATCHED = frozenset({"open", "os.listdir", "os.scandir"})


class OutsideRead(PermissionError):
    """A test read a path beside the checkout (copy the file into the repository instead)."""


class OutsideReadGuard:
    def __init__(self, root: Path) -> None:
        self.root = str(root.resolve())
        self.parent = str(root.resolve().parent)
        self.seen: list[str] = []
        machine = [
            tempfile.gettempdir(),
            os.path.expanduser("~"),
            sys.prefix,
            sys.base_prefix,
            sysconfig.get_paths()["purelib"],
            os.environ.get("PYTHONPYCACHEPREFIX", ""),
            os.environ.get("XDG_CACHE_HOME", ""),
        ]
        self.machine = [str(Path(p).resolve()) for p in machine if p]
        # the parent folder is the machine's own (e.g. the clone is /tmp/x): nothing to guard
        self.active = self.parent != "/" and not any(
            _within(place, self.parent) for place in self.machine
        )
        # a machine's place that holds the checkout (the clone is in /tmp/x) exempts nothing
        self.exempt = [place for place in self.machine if not _within(self.parent, place)]

    def offending(self, path: object) -> str | None:
        """The absolute path when ``path`` is beside the checkout, else None."""
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str | os.PathLike):
            return None  # a file descriptor
        text = os.path.abspath(os.fspath(path))
        if not _within(text, self.parent) or _within(text, self.root):
            return None
        if any(_within(text, place) for place in self.exempt):
            return None
        return text

    def hook(self, event: str, args: tuple[object, ...]) -> None:
        if event not in WATCHED or not args:
            return
        text = self.offending(args[0])
        if text is not None:
            self.seen.append(text)
            raise OutsideRead(
                f"{text} is outside the checkout ({self.root}): a clone has nothing beside it; "
                "copy the file into the repository with a SOURCE.md naming where it came from"
            )

    def install(self) -> bool:
        if self.active:
            sys.addaudithook(self.hook)
        return self.active


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
