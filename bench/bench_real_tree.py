"""The relay end to end on a real upstream tree: webhook -> selection -> shards on
``spyre-emu`` in containers -> dashboard, with the figures CRCR's L3 bar looks at.

It starts ``ci-relay serve`` (embedded: the API and a worker child, SQLite) on a tree built
by ``bench/real_tree.py`` (real PyTorch test files), with a spec covering every test file
in it (whole files, ``mandatory_success``), selection budget ``all`` (the whole universe),
``--shards`` shards and as many device slots. It sends one signed ``pull_request`` (the
tree's three changes) and follows the run through the JSON API, then prints: time to the
first stored result, time to completion, the run's counts against ``ci-relay specs show``'s
count of the same universe (a loss shows as a difference), and the peak resident memory of
the API process, the worker process and every shard container (sampled each second).

    python bench/real_tree.py $SCRATCH/real $SCRATCH/real-tree --force
    python bench/bench_real_tree.py $SCRATCH/real-tree [--shards 2] [--files test/x.py ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from ci_relay.demo import free_port, send_webhook

SECRET = "bench-real-tree"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def _peak_kb(pid: int) -> int:
    """A process's peak resident set (VmHWM), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


class ContainerMemory:
    """The largest memory use `podman stats` reported per container while it ran."""

    def __init__(self) -> None:
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            done = subprocess.run(
                ["podman", "stats", "--no-stream", "--format", "json"],
                capture_output=True,
                text=True,
                check=False,
            )
            try:
                rows = json.loads(done.stdout or "[]")
            except json.JSONDecodeError:
                continue
            for row in rows:
                used = str(row.get("mem_usage", "0B / 0B")).split("/")[0].strip()
                self.peak[row.get("name", "?")] = max(
                    self.peak.get(row.get("name", "?"), 0.0), _megabytes(used)
                )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _megabytes(text: str) -> float:
    units = {"kB": 1e-3, "KB": 1e-3, "MB": 1.0, "GB": 1e3, "B": 1e-6}
    for unit, factor in units.items():
        if text.endswith(unit):
            try:
                return float(text[: -len(unit)]) * factor
            except ValueError:
                return 0.0
    return 0.0


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _write_spec(spec: Path, files: list[str], dtypes: str) -> None:
    """The bench's spec: every test of ``files`` whole (``mandatory_success``), with the
    ``--dtypes`` named as its supported dtypes (none named: every dtype runs)."""
    spec.write_text(
        "test_suite_config:\n  files:\n"
        + "".join(
            f"    - path: ${{TORCH_ROOT}}/{f}\n      unlisted_test_mode: mandatory_success\n"
            for f in files
        )
        + (
            "  global:\n    supported_dtypes:\n"
            + "".join(f"      - name: {d.strip()}\n" for d in dtypes.split(","))
            if dtypes
            else ""
        )
    )


def _specs_show(spec: Path, tree: Path, files: list[str]) -> tuple[int, int]:
    """``ci-relay specs show``'s count of the spec's universe (what the run must store, none
    lost), and how many of the files do not import on this torch (one error result each)."""
    started = time.perf_counter()
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "ci_relay",
            "specs",
            "show",
            str(spec),
            "--upstream",
            str(tree),
            "--backend",
            "spyre-emu",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode not in (0, 1):  # 1: some files do not import; the rest is listed
        raise SystemExit(f"specs show failed ({shown.returncode}): {shown.stderr[-2000:]}")
    universe = len(json.loads(shown.stdout))
    unreadable = shown.stderr.count("COLLECTION ERROR")
    print(
        f"{len(files)} real test file(s), {unreadable} of them do not import on this torch; "
        f"specs show: {universe} spyre-emu variants ({time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    return universe, unreadable


def _serve_env(work: Path, tree: Path, spec: Path, shards: int) -> dict[str, str]:
    """``ci-relay serve``'s settings: the tree and its spec, the whole universe selected,
    ``shards`` shards a run on as many device slots, in containers."""
    return {
        **os.environ,
        "CI_RELAY_DATA_DIR": str(work / "data"),
        "CI_RELAY_WEBHOOK_SECRET": SECRET,
        "CI_RELAY_POLICY_FILE": str(work / "policy.yaml"),
        "CI_RELAY_UPSTREAM_REPO": str(tree),
        "CI_RELAY_SPECS": json.dumps([str(spec)]),
        "CI_RELAY_SELECTION_BUDGET": "all",
        "CI_RELAY_SELECTION_AGENT": "none",
        "CI_RELAY_SHARDS_PER_RUN": str(shards),
        "CI_RELAY_DEVICES": str(shards),
        "CI_RELAY_DEVICE_LOCK_DIR": str(work / "locks"),
        "CI_RELAY_RUNTIME": "container",
        "CI_RELAY_TRIAGE_MAX_TESTS": "0",
    }


def _wait_ready(url: str) -> None:
    """Until the API answers ``/readyz``, at most a minute (the webhook is sent then anyway)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)


def _pull_request(head: str, base: str) -> dict[str, Any]:
    """The ``pull_request`` webhook's payload: the tree's last three commits as one change."""
    return {
        "action": "opened",
        "number": 1,
        "pull_request": {
            "number": 1,
            "head": {"sha": head, "ref": "pr-1"},
            "base": {"sha": base, "ref": "main"},
            "labels": [],
        },
        "repository": {"full_name": "sample/pytorch"},
    }


def _follow(
    url: str, serve_pid: int, sent: float, timeout: float, peaks: dict[str, int]
) -> tuple[float | None, float | None, dict[str, Any]]:
    """Follow the run through the JSON API until it completes (or ``timeout`` after ``sent``,
    when the webhook went out), sampling the API's and the worker's peak memory into
    ``peaks``: the seconds from ``sent`` to its first stored result and to its completion
    (None when it did not get there), and the run as last read."""
    first = done = None
    run: dict[str, Any] = {}
    while time.perf_counter() - sent < timeout:
        peaks["api"] = max(peaks["api"], _peak_kb(serve_pid))
        for child in _children(serve_pid):
            peaks["worker"] = max(peaks["worker"], _peak_kb(child))
        grid = httpx.get(f"{url}/api/grid", timeout=30).json()
        ids = [c["run_id"] for row in grid.get("rows", []) for c in row.get("cells", {}).values()]
        if ids:
            run = httpx.get(f"{url}/api/runs/{ids[0]}", timeout=60).json()
            stored = sum(len(s.get("results", [])) for s in run.get("shards", []))
            if stored and first is None:
                first = time.perf_counter() - sent
            if run.get("state") == "completed":
                done = time.perf_counter() - sent
                break
        time.sleep(2)
    return first, done, run


def _print_figures(
    run: dict[str, Any],
    first: float | None,
    done: float | None,
    universe: int,
    unreadable: int,
    peaks: dict[str, int],
) -> None:
    """The run's times, its results against ``specs show``'s universe, its longest shard
    and the API's and worker's peak memory."""
    counts = run.get("counts", {})
    total = sum(counts.values()) - unreadable  # each such file is one error result
    print(f"time to first result: {first:.0f} s" if first else "no result stored")
    print(f"time to completion: {done:.0f} s" if done else "the run did not complete")
    if done:
        print(
            f"run: {run.get('conclusion')}, {counts}; {total} test results (and {unreadable} "
            f"collection errors) vs {universe} in specs show "
            f"({'none lost' if total == universe else f'DIFFERENCE {universe - total}'})"
        )
    longest = max(
        (
            _seconds(sh.get("finished_at")) - _seconds(sh.get("started_at"))
            for sh in run.get("shards", [])
            if sh.get("finished_at") and sh.get("started_at")
        ),
        default=0.0,
    )
    print(f"longest shard execution: {longest:.0f} s (CRCR's L3 bar: under 3 h)")
    print(f"peak RSS: API {peaks['api'] / 1024:.0f} MB, worker {peaks['worker'] / 1024:.0f} MB")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("tree", type=Path)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--files", nargs="*", help="test files to cover (default: all in test/)")
    parser.add_argument("--timeout", type=float, default=4 * 3600)
    parser.add_argument(
        "--dtypes",
        default="",
        help="the spec's supported dtypes, comma-separated (as torch-spyre's configs name "
        "them; the other dtypes' variants are skipped); default: every dtype runs",
    )
    args = parser.parse_args()
    tree = args.tree.resolve()
    files = args.files or sorted(
        p.relative_to(tree).as_posix() for p in (tree / "test").rglob("test_*.py")
    )
    head, base = _git(tree, "rev-parse", "HEAD"), _git(tree, "rev-parse", "HEAD~3")
    with tempfile.TemporaryDirectory(prefix="bench-real-tree-") as tmp:
        work = Path(tmp)
        spec = work / "spec.yaml"
        _write_spec(spec, files, args.dtypes)
        (work / "policy.yaml").write_text(
            "repositories:\n  sample/pytorch:\n    backends:\n      spyre-emu: {level: L2}\n"
        )
        universe, unreadable = _specs_show(spec, tree, files)
        port = free_port()
        env = _serve_env(work, tree, spec, args.shards)
        log = (work / "serve.log").open("wb")
        serve = subprocess.Popen(
            [sys.executable, "-m", "ci_relay", "serve", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        memory = ContainerMemory()
        peaks = {"api": 0, "worker": 0}
        try:
            _wait_ready(url)
            payload = _pull_request(head, base)
            sent = time.perf_counter()
            assert send_webhook(url, SECRET, "pull_request", payload).status_code == 202
            first, done, run = _follow(url, serve.pid, sent, args.timeout, peaks)
            page = httpx.get(f"{url}/runs/{run.get('id')}", timeout=60)
        finally:
            memory.stop()
            serve.terminate()
            serve.wait(60)
            log.close()
        _print_figures(run, first, done, universe, unreadable, peaks)
        for name, mb in sorted(memory.peak.items()):
            print(f"peak memory of container {name}: {mb:.0f} MB")
        print(f"dashboard run page: HTTP {page.status_code}, {len(page.content):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
