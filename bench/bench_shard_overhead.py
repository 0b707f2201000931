"""A shard's wall time against plain pytest with the reuse-spec plugin, on a real test file.

Issue 16, item 3. The baseline is one ``pytest`` process on the host with
``-p reuse_specs.pytest_plugin`` and the same spec and backend: the same variants,
skipped or run the same way. The measured side is the shard runner (``ci-relay run
--runtime R``: the child ``ci-relay run`` in a container or sandbox, its progress log,
restarts after a crash, and the rerun of failures). Both run alternately, several
rounds; printed are the medians, the counts (they must match) and the ratio (goals:
<= 1.10 on a 25k-variant file such as ``test_unary_ufuncs.py``, <= 1.05 on a small
one such as ``test_view_ops.py``).

The spec is a whole-file spec: every test must pass, and only the dtypes it names
run (the rest are skipped, as torch-spyre's ``supported_dtypes`` does).

Needs a real PyTorch test file (fetched with the search tool's ``read_file``, see
``bench/README.md``) inside a folder laid out like PyTorch (``ROOT/test/FILE``), and for
``--runtime container`` the runner image (``python -m ci_relay images build --backend B``).

    python bench/bench_shard_overhead.py /work/scratch/real/test/test_view_ops.py \\
        --backend spyre-emu --runtime container --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

SPEC = """
test_suite_config:
  files:
    - path: ${{TORCH_ROOT}}/test/{name}
      unlisted_test_mode: mandatory_success
  global:
    supported_dtypes:
{dtypes}
"""


def _counts(junit: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        kinds = {child.tag for child in case}
        if "skipped" in kinds:
            counts["skipped"] += 1
        elif "failure" in kinds or "error" in kinds:
            counts["failed/error"] += 1
        else:
            counts["passed"] += 1
    return counts


def _timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(
            f"{' '.join(cmd[:6])}... exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-3000:]}"
        )
    return elapsed, proc.stdout


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
    with tempfile.TemporaryDirectory(prefix="bench-shard-") as tmp:
        work = Path(tmp)
        spec = work / "spec.yaml"
        dtypes = "\n".join(f"      - name: {d.strip()}" for d in args.dtypes.split(","))
        spec.write_text(SPEC.format(name=test_file.name, dtypes=dtypes))
        ini = work / "pytest.ini"
        ini.write_text("[pytest]\n")
        plain = [
            sys.executable, "-B", "-m", "pytest", str(test_file),
            "-p", "reuse_specs.pytest_plugin", "--reuse-spec", str(spec),
            "--reuse-backend", args.backend, "--reuse-upstream", str(root),
            "-c", str(ini), "--rootdir", str(root), "-p", "no:cacheprovider", "-q",
            "-o", "junit_family=xunit2", "--junitxml", str(work / "plain.xml"),
        ]  # fmt: skip
        shard = [
            sys.executable, "-m", "ci_relay", "run", "--spec", str(spec),
            "--upstream", str(root), "--backend", args.backend, "--runtime", args.runtime,
            "--junit", str(work / "shard.xml"),
        ]  # fmt: skip
        print(f"{test_file.name} on {args.backend}; shard runtime {args.runtime}; "
              f"{args.rounds} round(s), alternating", flush=True)  # fmt: skip
        plain_times: list[float] = []
        shard_times: list[float] = []
        shard_out = ""
        for i in range(args.rounds):
            took, _ = _timed(plain, root)
            plain_times.append(took)
            took, shard_out = _timed(shard, root)
            shard_times.append(took)
            print(f"  round {i + 1}: pytest+plugin {plain_times[-1]:.1f}s  "
                  f"shard {shard_times[-1]:.1f}s", flush=True)  # fmt: skip
        plain_counts, shard_counts = _counts(work / "plain.xml"), _counts(work / "shard.xml")
        print(f"variants: pytest+plugin {dict(plain_counts)}; shard {dict(shard_counts)}")
        if sum(plain_counts.values()) != sum(shard_counts.values()):
            print("  COUNTS DIFFER: the two did not run the same variants")
        processes = [line for line in shard_out.splitlines() if "process(es)" in line]
        print(f"shard: {processes[-1].strip() if processes else '?'}")
        p, s = statistics.median(plain_times), statistics.median(shard_times)
        print(f"median pytest+plugin {p:.1f}s, shard {s:.1f}s")
        print(f"ratio shard / pytest+plugin = {s / p:.3f}")


if __name__ == "__main__":
    main()
