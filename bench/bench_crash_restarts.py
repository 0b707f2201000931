"""A crash costs one test, not a re-collection (issue 27, item 7).

One shard of a test file built on PyTorch's real OpInfo database (`@ops(op_db)` over every
operator, as `test_ops.py` and `test_unary_ufuncs.py` are: collection imports the database
and creates thousands of variants), with some variants crashing (SIGSEGV). The same shard
runs twice, alternating: the child restarting its own test process from its collected state
(the default), and the runner starting a new child per crash (the baseline: each collects
the whole file again). Prints seconds, processes, crashes and the ratio; both must give the
same results.

    python bench/bench_crash_restarts.py [--crashes 5] [--rounds 2] [--runtime local|sandbox]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci_relay.execution.runtimes import get_runtime  # noqa: E402
from ci_relay.execution.shard import ShardReport, ShardRequest, run_shard  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from bench_shard_overhead import PeakMemory  # noqa: E402

TESTS = """
import ctypes
from pathlib import Path

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests

CRASH = set(Path({crash_list!r}).read_text().split())


class TestOpInfo(TestCase):
    @ops(op_db, allowed_dtypes=(torch.float32, torch.float16))
    def test_named(self, device, dtype, op):
        if self.id().rsplit(".", 1)[-1] in CRASH:
            ctypes.string_at(0)  # SIGSEGV, as a broken kernel would
        self.assertTrue(op.name)


instantiate_device_type_tests(TestOpInfo, globals(), only_for="cpu")

if __name__ == "__main__":
    run_tests()
"""
SPEC = """test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_opinfo_crashes.py
      unlisted_test_mode: mandatory_success
"""


def _tree(work: Path, crashes: int) -> tuple[Path, Path, int]:
    """The upstream, its spec and how many variants it has; every n-th variant crashes."""
    upstream, crash_list = work / "up", work / "crash.txt"
    (upstream / "test").mkdir(parents=True)
    crash_list.write_text("")
    (upstream / "test" / "test_opinfo_crashes.py").write_text(
        TESTS.format(crash_list=str(crash_list))
    )
    spec = work / "spec.yaml"
    spec.write_text(SPEC)
    listed = subprocess.run(
        [sys.executable, "-m", "ci_relay", "specs", "show", str(spec), "--upstream", str(upstream),
         "--backend", "cpu", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    variants = sorted({v["nodeid"].rsplit("::", 1)[-1] for v in json.loads(listed)})
    step = max(1, len(variants) // (crashes + 1))
    crash_list.write_text("\n".join(variants[step::step][:crashes]) + "\n")
    crash_list.chmod(0o644)
    return upstream, spec, len(variants)


def _run(
    runtime_name: str, upstream: Path, spec: Path, scratch: Path, in_process: bool
) -> tuple[float, ShardReport, int]:
    request = ShardRequest(
        tests=["test/test_opinfo_crashes.py::TestOpInfo::test_named"],
        specs=[spec],
        upstream=upstream,
        backend="cpu",
        scratch=scratch,
        per_test_timeout=60,
        rerun_failures=False,
        restart_in_process=in_process,
        env={"PYTHONPATH": str(ROOT)},  # the children run this checkout's code
    )
    start = time.monotonic()
    with PeakMemory(pss=True) as memory:
        report = run_shard(get_runtime(runtime_name, "cpu"), request)
    return time.monotonic() - start, report, memory.peak_kb // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crashes", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runtime", default="local", choices=["local", "sandbox"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    work.chmod(0o755)
    try:
        upstream, spec, variants = _tree(work, args.crashes)
        print(f"{variants} variants; runtime {args.runtime}", flush=True)
        took: dict[bool, list[float]] = {True: [], False: []}
        outcomes: dict[bool, dict[str, str]] = {}
        for n in range(args.rounds):
            for in_process in (False, True):
                scratch = work / f"scratch-{n}-{in_process}"
                seconds, report, peak_mb = _run(args.runtime, upstream, spec, scratch, in_process)
                took[in_process].append(seconds)
                outcomes[in_process] = {k: r.outcome for k, r in report.results.items()}
                how = "in-process restarts" if in_process else "a new child per crash"
                print(
                    f"  round {n + 1}, {how:<22} {seconds:6.1f} s, {report.processes} process(es), "
                    f"{len(report.crashed)} crashed, {len(report.results)} results, "
                    f"peak {peak_mb} MB (PSS)",
                    flush=True,
                )
                shutil.rmtree(scratch, ignore_errors=True)
        if outcomes[True] != outcomes[False]:
            raise SystemExit("the two ways gave different results")
        base, new = min(took[False]), min(took[True])
        saved = (base - new) / max(1, sum(o == "crashed" for o in outcomes[True].values()))
        print(
            f"best of {args.rounds}: a new child per crash {base:.1f} s, in-process {new:.1f} s: "
            f"{new / base:.2f}x ({saved:.1f} s saved per crash)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
