"""Triage's cost: time from a run's completion to its verdict, and the device time triage
takes as a share of the run's own, for 1, 10 and 50 failing tests.

On a copy of the sample upstream, a PR adds nothing but a change to one helper that 1, 10
or 50 device-generic tests call (``x * 2`` becomes an FFT round trip times 2: the emulated card
has no FFT kernels), among 100 tests that pass. The relay (SQLite, embedded, the steps run in
this process as a worker runs them) selects, runs the 100 tests on ``spyre-emu`` and
collects; then its triage step reruns the failing ones at head, at the base and on cpu. The
baseline, measured in the same run, is the run itself: its shards' device time.

Run (needs the runner images for the container runtime: ``ci-relay images build --backend cpu
--backend spyre-emu``; ``--runtime sandbox`` uses bubblewrap instead)::

    python bench/bench_triage.py [--failing 1,10,50] [--runtime container]

On a real PyTorch test file instead (``--real``): the file is added to the sample upstream at
the base, the head replaces ``--edit OLD`` by ``NEW`` in it (a real-looking upstream change),
the relay runs the file's whole spyre-emu universe and triages up to ``--max-tests`` failures;
it prints each verdict and how many fell in each category (the file's failures on the
emulated card that predate the change should be ``backend``, the ones the edit broke
``upstream``). Fetch the file with the search tool's ``read_file`` (never into this
repository), e.g. ``test/test_view_ops.py`` of pytorch/pytorch at 01c12b2::

    python bench/bench_triage.py --real $SCRATCH/real/test/test_view_ops.py \
        --edit "        if contiguous:\n            return x\n" \
        --new "        if not contiguous:\n            return x\n" --max-tests 40
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.sample_upstream import build_sample_upstream
from ci_relay.settings import Settings
from ci_relay.steps import Next
from ci_relay.store.models import Delivery, DeliveryState, Run, Triage

TESTS = 100
SPEC = """\
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_triage_bench.py
      unlisted_test_mode: mandatory_success
"""


def _cases(failing: int, broken: bool) -> str:
    helper = "torch.fft.irfft(torch.fft.rfft(t), n=t.shape[0]) * 2" if broken else "t * 2"
    lines = [
        "import torch",
        "from torch.testing._internal.common_device_type import instantiate_device_type_tests",
        "from torch.testing._internal.common_utils import TestCase",
        "",
        "",
        "def twice(t):",
        f"    return {helper}",
        "",
        "",
        "class TestBench(TestCase):",
    ]
    for i in range(TESTS):
        body = "twice(t)" if i < failing else "t + t"
        lines += [
            f"    def test_case_{i:03d}(self, device):",
            "        t = torch.ones(8, device=device)",
            f"        self.assertEqual(({body}).cpu(), torch.full((8,), 2.0))",
            "",
        ]
    lines += ["", "instantiate_device_type_tests(TestBench, globals())", ""]
    return "\n".join(lines)


def _git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "b@x.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "b@x.invalid",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def _drain(rt: RelayContext, steps: list[Next], stop_at: str | None = None) -> list[Next]:
    """Run steps as a worker would; those of kind ``stop_at`` are handed back, not run."""
    held: list[Next] = []
    while steps:
        step = steps.pop(0)
        if step.task == stop_at:
            held.append(step)
        elif step.task != "report":  # reports stay in the outbox
            steps += pipeline.run_step(rt, step)
    return held


def measure(failing: int, work: Path, runtime: str) -> dict[str, Any]:
    upstream = work / "upstream"
    build_sample_upstream(upstream)
    (upstream / "test" / "test_triage_bench.py").write_text(_cases(failing, broken=False))
    _git(upstream, "add", "-A")
    _git(upstream, "commit", "-q", "-m", "bench tests")
    base = _git(upstream, "rev-parse", "HEAD")
    (upstream / "test" / "test_triage_bench.py").write_text(_cases(failing, broken=True))
    _git(upstream, "commit", "-q", "-am", "twice by dividing")
    head = _git(upstream, "rev-parse", "HEAD")
    rt = _relay(work, upstream, SPEC, runtime, failing)
    held = _drain(rt, [Next("process", _delivery(rt, base, head, str(failing)))], stop_at="triage")
    completed = time.perf_counter()
    _drain(rt, held)
    to_verdict = time.perf_counter() - completed
    with rt.db.session() as session:
        run = session.scalars(select(Run)).one()
        run_seconds = sum(
            (s.finished_at - s.started_at).total_seconds()
            for s in run.shards
            if s.started_at and s.finished_at
        )
        job = session.scalars(select(Triage)).one()
        categories = sorted({t["category"] for t in job.tests})
        failed = (run.counts or {}).get("failed", 0)
        return {
            "failing": failing,
            "failed_in_run": failed,
            "triaged": len(job.tests),
            "verdict": job.verdict.get("category"),
            "categories": ",".join(categories),
            "to_verdict": to_verdict,
            "triage_device": job.device_seconds,
            "run_device": run_seconds,
        }


def _relay(work: Path, upstream: Path, spec: str, runtime: str, max_tests: int) -> RelayContext:
    (work / "spec.yaml").write_text(spec)
    (work / "policy.yaml").write_text(
        "repositories:\n  sample/pytorch:\n    backends:\n      spyre-emu: {level: L2}\n"
    )
    rt = RelayContext(
        Settings(
            database_url=f"sqlite:///{work / 'relay.db'}",
            data_dir=work / "data",
            policy_file=work / "policy.yaml",
            upstream_repo=str(upstream),
            specs=[work / "spec.yaml"],
            selection_agent="none",
            selection_budget="all",
            runtime=runtime,
            triage_max_tests=max_tests,
            device_lock_dir=work / "locks",
        )
    )
    rt.db.upgrade()
    return rt


def _delivery(rt: RelayContext, base: str, head: str, name: str) -> int:
    """A stored pull_request delivery of head against base (what intake would store)."""
    payload = (
        '{"action": "opened", "number": 1, "repository": {"full_name": "sample/pytorch"}, '
        f'"pull_request": {{"number": 1, "head": {{"sha": "{head}", "ref": "pr"}}, '
        f'"base": {{"sha": "{base}", "ref": "main"}}, "labels": []}}}}'
    )
    with rt.db.session() as session:
        delivery = Delivery(
            source="github",
            hook_id="bench",
            delivery_id=f"bench-{name}",
            event="pull_request",
            action="opened",
            repository="sample/pytorch",
            head_sha=head,
            state=DeliveryState.RECEIVED,
            headers={},
            body=payload.encode(),
        )
        session.add(delivery)
        session.flush()
        return delivery.id


def unescape(value: str) -> str:
    """``\\n`` and friends in a command-line argument, as the text they stand for."""
    return value.encode().decode("unicode_escape")


def real(path: Path, old: str, new: str, max_tests: int, runtime: str, work: Path) -> None:
    """Triage on a real upstream test file: which failures the change caused, which not."""
    text = path.read_text(encoding="utf-8")
    if text.count(old) != 1:
        raise SystemExit(f"--edit must occur exactly once in {path} (found {text.count(old)})")
    name = path.name
    upstream = work / "upstream"
    build_sample_upstream(upstream)
    (upstream / "test" / name).write_text(text, encoding="utf-8")
    _git(upstream, "add", "-A")
    _git(upstream, "commit", "-q", "-m", f"real {name}")
    base = _git(upstream, "rev-parse", "HEAD")
    (upstream / "test" / name).write_text(text.replace(old, new), encoding="utf-8")
    _git(upstream, "commit", "-q", "-am", "the upstream change")
    head = _git(upstream, "rev-parse", "HEAD")
    spec = SPEC.replace("test_triage_bench.py", name)
    rt = _relay(work, upstream, spec, runtime, max_tests)
    started = time.perf_counter()
    held = _drain(rt, [Next("process", _delivery(rt, base, head, "real"))], stop_at="triage")
    run_wall = time.perf_counter() - started
    completed = time.perf_counter()
    _drain(rt, held)
    to_verdict = time.perf_counter() - completed
    with rt.db.session() as session:
        run = session.scalars(select(Run)).one()
        job = session.scalars(select(Triage)).one()
        counts = dict(run.counts or {})
        print(
            f"run: {counts} in {run_wall:.0f} s; "
            f"triage: {len(job.tests)} test(s) in {to_verdict:.0f} s "
            f"({job.device_seconds:.0f} s of device time)"
        )
        by: dict[str, int] = {}
        for t in job.tests:
            by[t["category"]] = by.get(t["category"], 0) + 1
            print(f"  {t['category']:>8} ({t['confidence']}) {t['test']}: {t['checks']}")
        print(
            f"by category: {by}; run verdict: {job.verdict.get('category')} "
            f"({job.verdict.get('confidence')})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--failing", default="1,10,50")
    parser.add_argument("--runtime", default="container", choices=["container", "sandbox", "local"])
    parser.add_argument("--real", type=Path, help="a real upstream test file (see above)")
    parser.add_argument("--edit", help="text of --real the head replaces (exactly once)")
    parser.add_argument("--new", default="", help="what replaces --edit")
    parser.add_argument("--max-tests", type=int, default=40)
    args = parser.parse_args()
    if args.real:
        if not args.edit:
            parser.error("--real needs --edit")
        with tempfile.TemporaryDirectory(prefix="bench-triage-") as tmp:
            real(
                args.real,
                unescape(args.edit),
                unescape(args.new),
                args.max_tests,
                args.runtime,
                Path(tmp),
            )
        return 0
    rows = []
    for n in (int(x) for x in args.failing.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench-triage-") as tmp:
            print(
                f"… {n} failing test(s) of {TESTS}, runtime {args.runtime}",
                file=sys.stderr,
                flush=True,
            )
            rows.append(measure(n, Path(tmp), args.runtime))
    print(
        f"{'failing':>8} {'triaged':>8} {'verdict':>9} {'run→verdict s':>14} "
        f"{'triage device s':>16} {'run device s':>13} {'ratio':>6}"
    )
    for r in rows:
        ratio = r["triage_device"] / r["run_device"] if r["run_device"] else float("nan")
        print(
            f"{r['failing']:>8} {r['triaged']:>8} {r['verdict']:>9} {r['to_verdict']:>14.1f} "
            f"{r['triage_device']:>16.1f} {r['run_device']:>13.1f} {ratio:>6.2f}"
        )
        if r["failed_in_run"] != r["failing"] or r["categories"] != "upstream":
            print(f"  unexpected: {r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
