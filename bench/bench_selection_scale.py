"""Selection at the edges of size: a history of 100,000 commits and a change of 10,000 files.

Issue 24 asks for bounded time with a note, never a hang. A generated repository (written
with ``git fast-import``): 2,000 source modules, 300 test files of 20 tests each, and
100,000 commits, each changing one module and, half the time, the test file paired with it;
then one sweep that changes 10,000 files. Prints, each next to a baseline measured in the
same run (reading the newest 3,000 commits with ``git log --raw``, the floor of any
history-based ranking):

- ``select()`` cold (history read, backtest, fit) and warm (the next change, from the cache)
  on the 100,000-commit history;
- ``select()`` on the 10,000-file change, with the notes it prints.

    python bench/bench_selection_scale.py [--commits 100000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from test_selection.selector import SelectorConfig, select  # noqa: E402
from test_selection.types import Budget  # noqa: E402

MODULES = 2000
TEST_FILES = 300
TESTS_PER_FILE = 20
SWEEP = 10_000


def _test_file(k: int, n: int) -> str:
    return "".join(
        f"def test_t{k}_{t}():\n    assert {n if t == n % TESTS_PER_FILE else 0} >= 0\n\n"
        for t in range(TESTS_PER_FILE)
    )


def _stream(commits: int) -> bytes:
    """A fast-import stream: the base, the history, then the sweep."""
    out: list[bytes] = []

    def commit(n: int, files: dict[str, str]) -> None:
        stamp = 1_600_000_000 + n
        out.append(f"commit refs/heads/main\ncommitter B <b@x.invalid> {stamp} +0000\n".encode())
        out.append(f"data {len(str(n))}\n{n}\n".encode())
        for path, text in files.items():
            data = text.encode()
            out.append(f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n")
        out.append(b"\n")

    base = {f"pkg/m{k:05d}.py": f"def f():\n    return {k}\n" for k in range(MODULES)}
    base |= {f"tests/test_t{k:03d}.py": _test_file(k, 0) for k in range(TEST_FILES)}
    commit(0, base)
    for n in range(1, commits):
        k = (n * 7919) % MODULES
        files = {f"pkg/m{k:05d}.py": f"def f():\n    return {n}\n"}
        if n % 2:
            files[f"tests/test_t{k % TEST_FILES:03d}.py"] = _test_file(k % TEST_FILES, n)
        commit(n, files)
    # one more ordinary change to select for warm, then the sweep
    commit(commits, {"pkg/m00001.py": "def f():\n    return -1\n"})
    sweep = {f"pkg/m{k:05d}.py": f"def f():\n    return {k} + 1\n" for k in range(MODULES)}
    sweep |= {f"pkg/new/n{k:05d}.py": f"X = {k}\n" for k in range(SWEEP - MODULES)}
    commit(commits + 1, sweep)
    return b"".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--commits", type=int, default=100_000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    repo = work / "up"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    began = time.perf_counter()
    subprocess.run(
        ["git", "fast-import", "--quiet"], cwd=repo, input=_stream(args.commits), check=True
    )
    print(f"generated {args.commits + 2} commits in {time.perf_counter() - began:.1f} s ({repo})")

    began = time.perf_counter()
    subprocess.run(
        ["git", "-C", str(repo), "log", "--no-merges", "--raw", "--no-abbrev", "-n3000", "main~2"],
        check=True,
        capture_output=True,
    )
    floor = time.perf_counter() - began
    print(f"baseline: git log --raw of the newest 3,000 commits: {floor:.2f} s")

    cache = work / "cache"
    config = SelectorConfig(budget=Budget.parse("15%"), cache_dir=cache)
    for label, base, head in (
        ("cold (backtest and fit)", "main~3", "main~2"),
        ("warm (the next change)", "main~2", "main~1"),
        ("10,000-file change", "main~1", "main"),
    ):
        began = time.perf_counter()
        plan, change = select(repo, base, head, None, config)
        seconds = time.perf_counter() - began
        print(
            f"select {label}: {seconds:.2f} s ({seconds / floor:.1f}x the baseline), "
            f"{len(change.files)} changed files, {len(plan.selected)} of {plan.universe_size} "
            f"tests selected, ranking {plan.ranking.get('chosen', 'hand weights')}"
        )
        print("  timings: " + ", ".join(f"{k} {v:.2f}" for k, v in plan.timings.items()))
        for note in plan.notes:
            print(f"  note: {note[:220]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
