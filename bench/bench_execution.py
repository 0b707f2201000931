"""Shard execution costs: container start per shard, and 1 vs 2 shards vs plain pytest.

A generated upstream of 200 CPU-bound tests (a pure-Python loop each). Printed,
all from this run: plain pytest on the host (the baseline), one shard in a
container, two shards in containers side by side, and the per-shard container
start overhead (a one-test shard in a container minus the same in a local
process). Goals: container overhead < 1 s per shard; 2 shards >= 1.7x faster
than 1 on this 2-core machine.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ci_relay.execution.runtimes import Limits, get_runtime
from ci_relay.execution.shard import ShardRequest, run_shard

TESTS = 200
SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_cpu_bound.py
      unlisted_test_mode: mandatory_success
"""


def _upstream(root: Path) -> list[str]:
    lines = [
        "from torch.testing._internal.common_utils import TestCase",
        "",
        "",
        "class TestWork(TestCase):",
    ]
    for i in range(TESTS):
        lines += [
            f"    def test_work_{i:03d}(self):",
            "        total = 0",
            "        for k in range(1_500_000):",
            "            total += k * k % 7",
            "        self.assertGreater(total, 0)",
            "",
        ]
    (root / "test").mkdir(parents=True)
    (root / "test" / "test_cpu_bound.py").write_text("\n".join(lines))
    return [f"test/test_cpu_bound.py::TestWork::test_work_{i:03d}" for i in range(TESTS)]


def _shard(runtime_name: str, tests: list[str], root: Path, spec: Path, scratch: Path) -> float:
    runtime = get_runtime(runtime_name)
    request = ShardRequest(
        tests=tests,
        specs=[spec],
        upstream=root,
        scratch=scratch,
        rerun_failures=False,
        limits=Limits(memory_mb=2048, wall_seconds=1800),
    )
    start = time.perf_counter()
    report = run_shard(runtime, request)
    elapsed = time.perf_counter() - start
    bad = [r for r in report.results.values() if r.outcome != "passed"]
    if bad or len(report.results) != len(tests):
        raise SystemExit(f"{runtime_name}: unexpected results {bad[:3]} ({len(report.results)})")
    return elapsed


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-exec-") as tmp:
        work = Path(tmp)
        root = work / "up"
        tests = _upstream(root)
        spec = work / "spec.yaml"
        spec.write_text(SPEC)
        (work / "pytest.ini").write_text("[pytest]\n")

        def plain_pytest(node_ids: list[str]) -> list[str]:
            return [
                *(sys.executable, "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider"),
                *("-c", str(work / "pytest.ini"), "--rootdir", str(root)),
                *(str(root / n) for n in node_ids),
            ]

        start = time.perf_counter()
        subprocess.run(plain_pytest(tests), check=True, capture_output=True)
        plain = time.perf_counter() - start
        # the machine's own ceiling: the same tests as two plain processes side by side
        start = time.perf_counter()
        pair = [
            subprocess.Popen(plain_pytest(tests[i::2]), stdout=subprocess.DEVNULL) for i in range(2)
        ]
        if any(proc.wait() != 0 for proc in pair):
            raise SystemExit("plain pytest failed on half of the tests")
        plain_two = time.perf_counter() - start

        local_one = _shard("local", tests[:1], root, spec, work / "s-local1")
        container_one = _shard("container", tests[:1], root, spec, work / "s-cont1")
        one = _shard("container", tests, root, spec, work / "s-one")
        halves = [tests[::2], tests[1::2]]
        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            list(
                pool.map(
                    lambda i: _shard("container", halves[i], root, spec, work / f"s-two{i}"),
                    range(2),
                )
            )
        two = time.perf_counter() - start

        print(f"{TESTS} CPU-bound tests")
        print(f"plain pytest on the host        {plain:6.2f}s (baseline)")
        print(f"1 shard in a container          {one:6.2f}s ({one / plain:.2f}x the baseline)")
        print(
            f"2 shards in containers          {two:6.2f}s ({two / plain:.2f}x; "
            f"speed-up over 1 shard {one / two:.2f}x, goal >= 1.7x)"
        )
        print(
            f"2 plain processes side by side  {plain_two:6.2f}s (the machine's ceiling: "
            f"{plain / plain_two:.2f}x over one; shards reach {one / two / (plain / plain_two):.0%}"
            " of it)"
        )
        print(
            f"per-shard fixed cost            {container_one:6.2f}s (a 1-test shard in a "
            f"container, start to result; {container_one / one:.1%} of the 1-shard run)"
        )
        print(
            f"container start per shard       {container_one - local_one:6.2f}s "
            f"(1-test shard: container {container_one:.2f}s vs local {local_one:.2f}s; goal < 1 s)"
        )


if __name__ == "__main__":
    main()
