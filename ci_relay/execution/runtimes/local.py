"""``local``: a plain subprocess, no isolation. Development only; never chosen by itself."""

from __future__ import annotations

import shutil
import sys

from ci_relay.execution.runtimes.process import (
    Completed,
    Invocation,
    _prepare_scratch,
    _prlimit,
    _run,
    shard_env,
)


class LocalRuntime:
    """A plain subprocess: no isolation at all. For development, clearly not for untrusted code."""

    name = "local"
    python = sys.executable

    def check(self) -> None:
        return None

    def run(self, inv: Invocation) -> Completed:
        work = _prepare_scratch(inv, None, 0o700)
        env = shard_env(inv.env, inv.scratch)
        prlimit = shutil.which("prlimit")
        argv = (_prlimit(prlimit, inv.limits) if prlimit else []) + inv.argv
        return _run(argv, env, work, inv.limits, inv.scratch)
