"""What recording a per-test coverage map costs (issue 34): a repository's own tests run with
plain pytest, with the recording plugin (function level: ``sys.monitoring``'s first call per
test on Python 3.12+, measured beside ``cProfile`` around each test there), with
the plugin recording lines too (issue 55: ``--coverage-lines``, coverage.py's tracer with one
context per test, as ``coverage record`` does by default), and with coverage.py's own per-test
dynamic contexts (``coverage run``), in alternating order so the page cache favours none.
Prints each mode's median seconds, its ratio to plain pytest in the same run, and the map's
size.

Needs a Python repository whose tests run here (not in this repository), e.g. networkx:

    # with the search tool: fetch github:networkx/networkx, then
    git clone -q $MIRROR_networkx $SCRATCH/networkx
    python bench/bench_coverage_record.py $SCRATCH/networkx --rounds 2 -- networkx/algorithms

Arguments after ``--`` go to pytest (what to run); the checkout is used as it is.
``--python`` runs the tests with the repository's own environment (it needs coverage.py for
the line modes); the plugin reaches it from a folder holding only ``test_selection``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from test_selection.coverage.map import CoverageMap  # noqa: E402


def _command(python: str, mode: str, repo: Path, out: Path, args: list[str]) -> list[str]:
    # failures are fine: every mode runs the same tests
    base = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", *args]
    if mode == "plain":
        return [python, *base]
    if mode.startswith("recorder"):
        return [
            python, *base, "-p", "test_selection.coverage_recorder",
            "--record-coverage", str(out), "--coverage-root", str(repo),
            *(["--coverage-lines"] if mode.endswith("+lines") else []),
            *(["--coverage-profiler", "cprofile"] if "cprofile" in mode else []),
        ]  # fmt: skip
    rc = out.with_suffix(".coveragerc")
    rc.write_text(
        "[run]\ndynamic_context = test_function\n"
        f"data_file = {out.with_suffix('.coverage')}\nsource = {repo}\n"
    )
    return [python, "-m", "coverage", "run", f"--rcfile={rc}", *base]


def _parity(monitored: Path, profiled: Path) -> None:
    """How far sys.monitoring's map agrees with cProfile's: the (test, function) pairs both
    hold, and among them those recorded at the same distance."""
    if not (monitored.is_file() and profiled.is_file()):
        return
    a, b = CoverageMap.load(monitored).tests, CoverageMap.load(profiled).tests
    pairs_a = {(t, f): d for t, fs in a.items() for f, d in fs.items()}
    pairs_b = {(t, f): d for t, fs in b.items() for f, d in fs.items()}
    both = pairs_a.keys() & pairs_b.keys()
    same = sum(1 for k in both if pairs_a[k] == pairs_b[k])
    print(
        f"parity: {len(both)} (test, function) pairs in both maps, {len(pairs_a) - len(both)} "
        f"only with sys.monitoring, {len(pairs_b) - len(both)} only with cProfile; "
        f"{same / max(1, len(both)):.3f} of the shared at the same distance"
    )


def _line_parity(monitored: Path, traced: Path) -> None:
    """The (test, file, line) triples sys.monitoring's lines and coverage.py's share."""
    if not (monitored.is_file() and traced.is_file()):
        return

    def triples(path: Path) -> set[tuple[str, str, int]]:
        lines = CoverageMap.load(path).lines
        return {(t, f, n) for t, files in lines.items() for f, ns in files.items() for n in ns}

    a, b = triples(monitored), triples(traced)
    print(
        f"line parity: {len(a & b)} (test, file, line) in both, {len(a - b)} only with "
        f"sys.monitoring, {len(b - a)} only with coverage.py"
    )


def main() -> int:
    argv = sys.argv[1:]
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("repo", type=Path, help="a checkout whose tests run here")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--python", default=sys.executable, help="the repository's own Python")
    opts = ap.parse_args(own)
    repo = opts.repo.resolve()
    modes = ["plain", "recorder"]
    monitoring = subprocess.run(
        [opts.python, "-c", "import sys; sys.monitoring"], capture_output=True, check=False
    )
    if monitoring.returncode == 0:  # "recorder" is sys.monitoring's there; cProfile beside it
        modes += ["recorder-cprofile"]
    has_coverage = subprocess.run(
        [opts.python, "-c", "import coverage"], capture_output=True, check=False
    )
    if has_coverage.returncode == 0:
        modes += ["recorder+lines", "coverage.py"]
        if "recorder-cprofile" in modes:  # lines by sys.monitoring, and by coverage.py
            modes.insert(-1, "recorder-cprofile+lines")
    else:
        print("coverage.py is not installed there: the line modes are left out")
    paths = [str(repo), *([str(repo / "src")] if (repo / "src").is_dir() else [])]
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as scratch:
        plugin = Path(scratch) / "plugin"
        plugin.mkdir()
        (plugin / "test_selection").symlink_to(ROOT / "test_selection")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(plugin)])}
        env.pop("PYTEST_ADDOPTS", None)
        for round_ in range(opts.rounds):
            order = modes if round_ % 2 == 0 else list(reversed(modes))
            for mode in order:
                out = Path(scratch) / f"{mode}-{round_}.json.gz"
                start = time.perf_counter()
                proc = subprocess.run(
                    _command(opts.python, mode, repo, out, pytest_args),
                    cwd=repo,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                took = time.perf_counter() - start
                seconds[mode].append(took)
                tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
                print(
                    f"round {round_ + 1} {mode:<12} {took:8.1f} s  exit {proc.returncode} {tail[0]}"
                )
                if mode.startswith("recorder") and out.is_file():
                    sizes[mode] = out.stat().st_size
                    cmap = CoverageMap.load(out)
                    print(
                        f"    map: {len(cmap.tests)} tests, {len(cmap.functions())} functions, "
                        f"lines of {len(cmap.lines)} tests {cmap.lines_missing}"
                    )
                elif mode == "coverage.py" and out.with_suffix(".coverage").is_file():
                    sizes[mode] = out.with_suffix(".coverage").stat().st_size
        if "recorder-cprofile" in modes:
            first = Path(scratch)
            _parity(first / "recorder-0.json.gz", first / "recorder-cprofile-0.json.gz")
            _line_parity(
                first / "recorder+lines-0.json.gz", first / "recorder-cprofile+lines-0.json.gz"
            )
    plain = statistics.median(seconds["plain"])
    print(f"\n{'mode':<15} {'median s':>9} {'ratio':>7} {'data':>10}")
    for mode in modes:
        median = statistics.median(seconds[mode])
        size = f"{sizes[mode] / 1e6:.2f} MB" if mode in sizes else "-"
        print(f"{mode:<15} {median:9.1f} {median / plain:6.2f}x {size:>10}")
    print("goal: recording <= 1.5x plain pytest")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
