"""A fork server for ``bench/mutation_lib.py``: imports the modules named on its command line
once (torch and its testing helpers take seconds), then for each request on stdin (one JSON
line: ``{"args": [...], "cwd": DIR, "env": {...}, "out": FILE}``) forks a child in its own
session that runs ``pytest.main(args)`` with its output in FILE, and answers on stdout with
``{"pid": N}`` and, when the child ends, ``{"pid": N, "status": CODE}`` (negative: killed by
that signal). The runner enforces the timeout by killing the child's process group. Nothing
the child does (a mutant, a crash) reaches the server.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def _child(request: dict[str, object]) -> None:
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    out = os.open(str(request["out"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.chdir(str(request["cwd"]))
    env = request.get("env") or {}
    assert isinstance(env, dict)
    os.environ.update({str(k): str(v) for k, v in env.items()})
    code = 3
    try:
        import pytest

        args = request["args"]
        assert isinstance(args, list)
        code = int(pytest.main([str(a) for a in args]))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    for name in sys.argv[1:]:
        importlib.import_module(name)
    import pytest  # noqa: F401  (imported once here too)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "status": os.waitstatus_to_exitcode(status)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
