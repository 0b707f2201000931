"""A shard's wall time against plain pytest with the reuse-spec plugin, on a real test file.

Issue 16, item 3. Three ways to run the same variants of one real PyTorch test file
under the same whole-file spec and backend, alternately, several rounds:

- **pytest+plugin, host**: one ``pytest -p reuse_specs.pytest_plugin`` process on the
  host, with pytest's plugin autoload off (the host has test tooling installed that the
  runner images do not: hypothesis, playwright, benchmark, ...);
- **pytest+plugin, same runtime**: the same command as one process in the shard's
  runtime (container or sandbox), so isolation's own start-up is in the baseline too;
- **shard**: :func:`run_shard`, what a worker runs (the child ``ci-relay run`` with its
  progress log and timeout watchdog, restarts after a crash, the rerun of failures).

Printed: medians, the counts (they must match), and the shard's ratio to each baseline
(goals: <= 1.10 on a 25k-variant file such as ``test_unary_ufuncs.py``, <= 1.05 on a
small one such as ``test_view_ops.py``). The spec is a whole-file spec: every test must
pass and only the dtypes it names run (the rest are skipped, as torch-spyre's
``supported_dtypes`` does).

``--split`` (issue 27, item 8) runs each step between the two ends instead (one round, or
``--split-rounds N`` rounds in turn, medians), so the difference each adds is printed, in
seconds and in ms per variant: collection alone; pytest+plugin on the host; the same
with the progress plugin (its JSON-lines log and the per-test timeout watchdog); the shard
through the ``local`` runtime (the child process, the runner tailing its log, restarts); the
shard in the isolating runtime (``--runtime``). Each step's peak memory (the largest sum of
the RSS of the bench's descendant processes, sampled every 0.2 s) is printed beside it: a
shard's peak is what item 6 bounds.

``--memory`` (issue 27, item 6) runs the shard in the isolating runtime twice, as a worker
does: streaming its results to a store (the store here only counts them) and, as the
baseline, with the runner holding every result until the shard ends (``run_shard`` without
``on_results``). Printed for each: the peak memory of the runner's own process (what the
worker adds for the shard, above where it started) and of the shard's processes (PSS), and
the results each got.

``--cli`` (issue 37) times what a user runs, the command line both ways, in alternating order
(in process, isolated, in process, isolated, ...: the page cache favours neither):
``ci-relay run --spec S --upstream ROOT --backend B`` against the same with ``--runtime R``.
Printed: each run, the counts of each (they must match), the median ratio isolated / in
process, the ratio of each round's pair, and the cost per variant in ms (the medians'
difference over the variants run; goal <= 2 ms, ratio <= 1.10).

``--load N`` (any mode) keeps N busy processes running beside the bench (one core's worth
of load with N = 1, as on a shared CI machine): a per-test cost that hides in a thread
handoff or a wake-up shows there, not on a quiet machine.

``--coverage`` (issue 34) runs the shard as the relay's nightly does, recording which
functions each test executes (``record_coverage``: the recorder in every test process,
appending each test's record as it ends), against the same shard without it, alternating:
medians, the ratio (goal <= 1.5), the counts (they must match), and the map the worker would
store (tests, functions, gzip size).

Needs a real PyTorch test file (fetched with the search tool's ``read_file``, see
``bench/README.md``) in a folder laid out like PyTorch (``ROOT/test/FILE``), and for
``--runtime container`` the runner image (``python -m ci_relay images build --backend B``).

    python bench/bench_shard_overhead.py $SCRATCH/real/test/test_view_ops.py \\
        --backend spyre-emu --runtime container --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ci_relay.execution.runtimes import Invocation, Limits, Runtime, get_runtime, work_dir
from ci_relay.execution.shard import ShardReport, ShardRequest, run_shard
from ci_relay.execution.spec_run import TestOutcome
from reuse_specs.upstream_index import generic_test_ids

SPEC = """
test_suite_config:
  files:
    - path: ${{TORCH_ROOT}}/test/{name}
      unlisted_test_mode: mandatory_success
  global:
    supported_dtypes:
{dtypes}
"""
LIMITS = Limits(memory_mb=8192, wall_seconds=4 * 3600)


def _write_inputs(work: Path, test_file: Path, dtypes: str) -> tuple[Path, Path]:
    """The whole-file spec (only ``dtypes`` run) and an empty pytest.ini, in ``work``."""
    spec = work / "spec.yaml"
    listed = "\n".join(f"      - name: {d.strip()}" for d in dtypes.split(","))
    spec.write_text(SPEC.format(name=test_file.name, dtypes=listed))
    ini = work / "pytest.ini"
    ini.write_text("[pytest]\n")
    return spec, ini


def _request(tests: list[str], spec: Path, root: Path, scratch: Path, backend: str) -> ShardRequest:
    """The shard every mode runs: the file's tests under the whole-file spec."""
    return ShardRequest(
        tests=tests, specs=[spec], upstream=root, scratch=scratch, backend=backend, limits=LIMITS
    )


def _junit_counts(junit: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        kinds = {child.tag for child in case}
        if "skipped" in kinds:
            counts["skipped"] += 1
        elif "failure" in kinds or "error" in kinds:
            counts["failed"] += 1
        else:
            counts["passed"] += 1
    return counts


def _shard_counts(report: ShardReport) -> Counter[str]:
    counts: Counter[str] = Counter()
    for r in report.results.values():
        counts["failed" if r.outcome in ("failed", "error", "crashed") else r.outcome] += 1
    return counts


def _plain_argv(python: str, test_file: Path, spec: Path, backend: str, root: Path) -> list[str]:
    return [
        *(python, "-B", "-m", "pytest", str(test_file), "-p", "reuse_specs.pytest_plugin"),
        *("--reuse-spec", str(spec), "--reuse-backend", backend, "--reuse-upstream", str(root)),
        *("--rootdir", str(root), "-p", "no:cacheprovider", "-q", "-o", "junit_family=xunit2"),
    ]


def _host(argv: list[str], ini: Path, junit: Path, root: Path) -> float:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [*argv, "-c", str(ini), "--junitxml", str(junit)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        sys.exit(f"host pytest exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr}")
    return time.perf_counter() - start


def _in_runtime(runtime: Runtime, argv: list[str], spec: Path, root: Path, scratch: Path) -> float:
    """The plain command as one process in the runtime; its spec and ini are in scratch,
    where the runtime lets the child read them."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    (scratch / "pytest.ini").write_text("[pytest]\n")
    shutil.copyfile(spec, scratch / spec.name)
    junit = work_dir(scratch) / "plain.xml"
    argv = [a if a != str(spec) else str(scratch / spec.name) for a in argv]
    argv += ["-c", str(scratch / "pytest.ini"), "--junitxml", str(junit)]
    start = time.perf_counter()
    done = runtime.run(Invocation(argv, root, scratch, limits=LIMITS))
    took = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"pytest in {runtime.name} exited {done.returncode}:\n{done.output[-3000:]}")
    shutil.copyfile(junit, scratch.parent / "runtime.xml")
    return took


class PeakMemory:
    """The largest total RSS of this process's descendants while the block runs (sampled
    from /proc every 0.2 s): what a shard's processes hold at their peak. ``pss``: each
    shared page counted once, split between its sharers (a forked child shares its parent's
    pages until it writes them; RSS would count them twice). ``own_peak_kb``: this process's
    own largest RSS above what it held when the block began (a runner's cost)."""

    def __init__(self, pss: bool = False) -> None:
        self.pss = pss
        self.peak_kb = 0
        self.own_peak_kb = 0
        self._own_start = _own_rss_kb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._own_start = _own_rss_kb()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def _sample(self) -> None:
        self.peak_kb = max(self.peak_kb, _descendants_rss_kb(os.getpid(), self.pss))
        self.own_peak_kb = max(self.own_peak_kb, _own_rss_kb() - self._own_start)


def _own_rss_kb() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants_rss_kb(root: int, pss: bool = False) -> int:
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            statm = Path(f"/proc/{entry}/statm").read_text().split()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        rss[int(entry)] = int(statm[1]) * page_kb
    total, frontier = 0, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            total += _pss_kb(child) if pss else rss.get(child, 0)
            frontier.append(child)
    return total


def _split(args: argparse.Namespace, runtime: Runtime, test_file: Path, root: Path) -> None:
    """Each step from plain pytest to the isolated shard, in turn, ``--split-rounds`` times:
    the seconds (median), ms per variant and peak memory each adds."""
    tests = generic_test_ids(test_file, root)
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        work = Path(tmp)
        spec, ini = _write_inputs(work, test_file, args.dtypes)
        plain = _plain_argv(sys.executable, test_file, spec, args.backend, root)
        progress = [
            *("-p", "ci_relay.execution.progress_plugin"),
            *("--progress-log", str(work / "progress.jsonl")),
            *("--per-test-timeout", "600"),
        ]

        def shard(on: Runtime, name: str) -> Callable[[], object]:
            request = _request(tests, spec, root, work / f"shard-{name}", args.backend)
            return lambda: run_shard(on, request)

        steps: list[tuple[str, str, Callable[[], object]]] = [
            (
                "collection only",
                "import and collection",
                lambda: _host([*plain, "--collect-only"], ini, work / "c.xml", root),
            ),
            (
                "pytest+plugin, host",
                "running the variants",
                lambda: _host(plain, ini, work / "host.xml", root),
            ),
            (
                "+ progress log and timeout",
                "the JSON-lines log, the per-test watchdog",
                lambda: _host([*plain, *progress], ini, work / "progress.xml", root),
            ),
            (
                "shard, local runtime",
                "child process, log tail, restarts, runner",
                shard(get_runtime("local", args.backend), "local"),
            ),
            (
                f"shard, {runtime.name}",
                f"{runtime.name} isolation",
                shard(runtime, runtime.name),
            ),
        ]
        took: dict[str, list[float]] = {name: [] for name, _adds, _run in steps}
        peak: dict[str, float] = dict.fromkeys(took, 0.0)
        for i in range(args.split_rounds):
            for name, _adds, run in steps:  # the same order each round: ABCDE ABCDE
                with PeakMemory() as memory:
                    start = time.perf_counter()
                    result = run()
                    took[name].append(time.perf_counter() - start)
                peak[name] = max(peak[name], memory.peak_kb / 1024)
                print(f"  round {i + 1}: {name} {took[name][-1]:.1f}s", flush=True)
                if isinstance(result, ShardReport) and i == 0:
                    counts = _shard_counts(result)
                    print(
                        f"    {sum(counts.values())} results {dict(sorted(counts.items()))}, "
                        f"{result.processes} process(es), {len(result.crashed)} crashed"
                    )
        variants = sum(_junit_counts(work / "host.xml").values()) or 1
        print(
            f"{'step':34} {'seconds':>8} {'added':>8} {'ms/var':>7} {'peak MB':>8}  "
            "what the step adds (medians)"
        )
        before: float | None = None
        for name, adds, _run in steps:
            med = statistics.median(took[name])
            added = per = ""
            if before is not None:
                added, per = f"{med - before:+8.1f}", f"{(med - before) / variants * 1000:+7.2f}"
            print(f"{name:34} {med:8.1f} {added:>8} {per:>7} {peak[name]:8.0f}  {adds}")
            before = med
        print(f"variants, pytest+plugin host: {dict(_junit_counts(work / 'host.xml'))}")


def _memory(args: argparse.Namespace, runtime: Runtime, test_file: Path, root: Path) -> None:
    """The shard as a worker runs it, streaming its results, against the runner holding them
    all: the runner's own peak and the shard's processes' peak (PSS)."""
    tests = generic_test_ids(test_file, root)
    print(f"{test_file.name}: {len(tests)} generic tests on {args.backend}, {runtime.name}")
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        work = Path(tmp)
        spec, _ini = _write_inputs(work, test_file, args.dtypes)
        stored: Counter[str] = Counter()

        def store(found: list[TestOutcome]) -> None:  # a database would keep them; we count
            stored.update("flaky" if r.flaky else r.outcome for r in found)

        print(f"{'mode':30} {'seconds':>8} {'runner MB':>10} {'shard PSS MB':>13}  results")
        for i, mode in enumerate(("streamed (a worker)", "held by the runner")):
            stored.clear()
            request = _request(tests, spec, root, work / f"shard-{i}", args.backend)
            streamed = mode.startswith("streamed")
            with PeakMemory(pss=True) as memory:
                start = time.perf_counter()
                report = run_shard(runtime, request, on_results=store if streamed else None)
                took = time.perf_counter() - start
            counts = stored if streamed else Counter(r.outcome for r in report.results.values())
            print(
                f"{mode:30} {took:8.1f} {memory.own_peak_kb / 1024:10.1f} "
                f"{memory.peak_kb / 1024:13.0f}  {sum(counts.values())} "
                f"{dict(sorted(counts.items()))}",
                flush=True,
            )
            del report


def _coverage(args: argparse.Namespace, runtime: Runtime, test_file: Path, root: Path) -> None:
    """The shard with the coverage recorder on, against the same shard without it."""
    import gzip
    import json

    from test_selection.coverage.map import read_streams

    tests = generic_test_ids(test_file, root)
    print(
        f"{test_file.name}: {len(tests)} generic tests on {args.backend}, {runtime.name}; "
        f"{args.rounds} round(s), alternating",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-coverage-") as tmp:
        work = Path(tmp)
        spec, _ini = _write_inputs(work, test_file, args.dtypes)
        times: dict[bool, list[float]] = {False: [], True: []}
        counts: dict[bool, Counter[str]] = {}
        for i in range(args.rounds):
            for record in (False, True) if i % 2 == 0 else (True, False):
                request = _request(tests, spec, root, work / f"shard-{i}-{record}", args.backend)
                request.record_coverage = record
                start = time.perf_counter()
                report = run_shard(runtime, request)
                times[record].append(time.perf_counter() - start)
                counts[record] = _shard_counts(report)
                label = "recording" if record else "plain"
                print(f"  round {i + 1}: {label} {times[record][-1]:.1f}s", flush=True)
                if record:
                    cmap, skipped = read_streams(
                        report.coverage_streams, "pytorch/pytorch", "0" * 40, args.backend
                    )
                    packed = gzip.compress(json.dumps(cmap.to_json()).encode(), compresslevel=6)
                    flagged = sum(1 for marks in cmap.flags.values() if marks)
                    print(
                        f"    map: {len(cmap.tests)} tests, {len(cmap.functions())} functions, "
                        f"{len(packed) / 1e6:.2f} MB gzip, {flagged} flagged, {skipped} "
                        "unreadable line(s); streams "
                        f"{sum(p.stat().st_size for p in report.coverage_streams) / 1e6:.1f} MB",
                        flush=True,
                    )
        for record, c in counts.items():
            print(f"variants, {'recording' if record else 'plain'}: {sum(c.values())} {dict(c)}")
        if counts[False] != counts[True]:
            print("  COUNTS DIFFER: recording changed what ran or how it ended")
        plain, recording = statistics.median(times[False]), statistics.median(times[True])
        print(f"median: plain {plain:.1f}s, recording {recording:.1f}s")
        print(f"ratio recording / plain = {recording / plain:.3f} (goal <= 1.5)")


class Load:
    """``n`` busy-looping processes while the block runs: a machine whose other core (or
    part of this one) is taken, as when a CI job shares it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Load:
        spin = "while True:\n    pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(self.n)]
        if self.n:
            print(f"load: {self.n} busy process(es) beside the bench", flush=True)
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def _cli(args: argparse.Namespace, test_file: Path, root: Path) -> None:
    """``ci-relay run`` in process against ``ci-relay run --runtime R``, alternating."""
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        work = Path(tmp)
        spec, _ini = _write_inputs(work, test_file, args.dtypes)
        base = [sys.executable, "-m", "ci_relay", "run", "--spec", str(spec)]
        base += ["--upstream", str(root), "--backend", args.backend]
        modes = {"in process": [], f"--runtime {args.runtime}": ["--runtime", args.runtime]}
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        counts: dict[str, Counter[str]] = {}
        print(
            f"{test_file.name} on {args.backend}: ci-relay run, in process and with --runtime "
            f"{args.runtime}; {args.rounds} round(s), alternating",
            flush=True,
        )
        for i in range(args.rounds):
            for n, (mode, extra) in enumerate(modes.items()):
                junit = work / f"run-{i}-{n}.xml"
                start = time.perf_counter()
                done = subprocess.run(
                    [*base, *extra, "--junit", str(junit)],
                    cwd=work,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                times[mode].append(time.perf_counter() - start)
                if done.returncode not in (0, 1) or not junit.is_file():
                    sys.exit(f"{mode}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr}")
                counts[mode] = _junit_counts(junit)
                print(f"  round {i + 1}: {mode} {times[mode][-1]:.1f}s", flush=True)
        for mode, c in counts.items():
            print(f"variants, {mode}: {sum(c.values())} {dict(sorted(c.items()))}")
        totals = {sum(c.values()) for c in counts.values()}
        if len(totals) != 1:
            print("  COUNTS DIFFER: they did not run the same variants")
        inside, isolated = (times[mode] for mode in modes)
        pairs = ", ".join(f"{b / a:.3f}" for a, b in zip(inside, isolated, strict=True))
        med_in, med_iso = statistics.median(inside), statistics.median(isolated)
        variants = max(totals)
        print(f"median: in process {med_in:.1f}s, --runtime {args.runtime} {med_iso:.1f}s")
        ratio = med_iso / med_in
        print(f"ratio --runtime {args.runtime} / in process = {ratio:.3f} (goal <= 1.10)")
        print(f"ratio per round (alternating pairs): {pairs}")
        print(
            f"cost per variant = {(med_iso - med_in) / variants * 1000:.2f} ms "
            f"over {variants} variants (goal <= 2 ms)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="ROOT/test/test_x.py, a real PyTorch test file")
    parser.add_argument("--backend", default="spyre-emu")
    parser.add_argument("--runtime", default="container", choices=["container", "sandbox"])
    parser.add_argument("--dtypes", default="float16,float32", help="the spec's supported dtypes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--split", action="store_true", help="each step between, in turn")
    parser.add_argument(
        "--split-rounds", type=int, default=1, help="rounds of --split's steps (medians)"
    )
    parser.add_argument(
        "--memory", action="store_true", help="the runner's memory, streamed against held"
    )
    parser.add_argument(
        "--coverage", action="store_true", help="the shard recording coverage, against without"
    )
    parser.add_argument(
        "--cli", action="store_true", help="ci-relay run in process against --runtime, alternating"
    )
    parser.add_argument(
        "--load", type=int, default=0, metavar="N", help="N busy processes beside the bench"
    )
    args = parser.parse_args()
    test_file = args.file.resolve()
    root = test_file.parent.parent
    if test_file.parent.name != "test" or not test_file.is_file():
        sys.exit(f"{args.file}: expected ROOT/test/<file>.py (a PyTorch-shaped folder)")
    with Load(args.load):
        _measure(args, test_file, root)


def _measure(args: argparse.Namespace, test_file: Path, root: Path) -> None:
    if args.cli:
        _cli(args, test_file, root)
        return
    runtime = get_runtime(args.runtime, args.backend)
    if args.split:
        _split(args, runtime, test_file, root)
        return
    if args.memory:
        _memory(args, runtime, test_file, root)
        return
    if args.coverage:
        _coverage(args, runtime, test_file, root)
        return
    tests = generic_test_ids(test_file, root)
    with tempfile.TemporaryDirectory(prefix="bench-shard-") as tmp:
        work = Path(tmp)
        spec, _ini = _write_inputs(work, test_file, args.dtypes)
        print(
            f"{test_file.name} ({len(tests)} generic tests) on {args.backend}; runtime "
            f"{runtime.name}; {args.rounds} round(s), alternating",
            flush=True,
        )
        times: dict[str, list[float]] = {"host": [], "runtime": [], "shard": []}
        report = ShardReport()
        for i in range(args.rounds):
            argv = _plain_argv(sys.executable, test_file, spec, args.backend, root)
            times["host"].append(_host(argv, work / "pytest.ini", work / "host.xml", root))
            argv = _plain_argv(runtime.python, test_file, spec, args.backend, root)
            times["runtime"].append(_in_runtime(runtime, argv, spec, root, work / "plain"))
            request = _request(tests, spec, root, work / f"shard-{i}", args.backend)
            start = time.perf_counter()
            report = run_shard(runtime, request)
            times["shard"].append(time.perf_counter() - start)
            print(
                f"  round {i + 1}: pytest+plugin host {times['host'][-1]:.1f}s, "
                f"in {runtime.name} {times['runtime'][-1]:.1f}s; shard {times['shard'][-1]:.1f}s",
                flush=True,
            )
        counts = {
            "pytest+plugin host": _junit_counts(work / "host.xml"),
            f"pytest+plugin in {runtime.name}": _junit_counts(work / "runtime.xml"),
            "shard": _shard_counts(report),
        }
        for name, c in counts.items():
            print(f"variants, {name}: {sum(c.values())} {dict(sorted(c.items()))}")
        if len({sum(c.values()) for c in counts.values()}) != 1:
            print("  COUNTS DIFFER: they did not run the same variants")
        print(f"shard: {report.processes} process(es), {len(report.crashed)} crashed")
        for line in report.log:
            if "not rerun" in line:
                print(f"shard: {line}")
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"median: pytest+plugin host {med['host']:.1f}s, in {runtime.name} "
            f"{med['runtime']:.1f}s, shard {med['shard']:.1f}s"
        )
        print(f"ratio shard / pytest+plugin on the host = {med['shard'] / med['host']:.3f}")
        print(
            f"ratio shard / pytest+plugin in {runtime.name} = {med['shard'] / med['runtime']:.3f}"
        )


if __name__ == "__main__":
    main()
