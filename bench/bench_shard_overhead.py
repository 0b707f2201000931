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

Needs a real PyTorch test file (fetched with the search tool's ``read_file``, see
``bench/README.md``) in a folder laid out like PyTorch (``ROOT/test/FILE``), and for
``--runtime container`` the runner image (``python -m ci_relay images build --backend B``).

    python bench/bench_shard_overhead.py /work/scratch/real/test/test_view_ops.py \\
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
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from ci_relay.execution.runtimes import Invocation, Limits, Runtime, get_runtime, work_dir
from ci_relay.execution.shard import ShardReport, ShardRequest, run_shard
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="ROOT/test/test_x.py, a real PyTorch test file")
    parser.add_argument("--backend", default="spyre-emu")
    parser.add_argument("--runtime", default="container", choices=["container", "sandbox"])
    parser.add_argument("--dtypes", default="float16,float32", help="the spec's supported dtypes")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    test_file = args.file.resolve()
    root = test_file.parent.parent
    if test_file.parent.name != "test" or not test_file.is_file():
        sys.exit(f"{args.file}: expected ROOT/test/<file>.py (a PyTorch-shaped folder)")
    runtime = get_runtime(args.runtime, args.backend)
    tests = generic_test_ids(test_file, root)
    with tempfile.TemporaryDirectory(prefix="bench-shard-") as tmp:
        work = Path(tmp)
        spec = work / "spec.yaml"
        dtypes = "\n".join(f"      - name: {d.strip()}" for d in args.dtypes.split(","))
        spec.write_text(SPEC.format(name=test_file.name, dtypes=dtypes))
        (work / "pytest.ini").write_text("[pytest]\n")
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
            request = ShardRequest(
                tests=tests,
                specs=[spec],
                upstream=root,
                scratch=work / f"shard-{i}",
                backend=args.backend,
                limits=LIMITS,
            )
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
