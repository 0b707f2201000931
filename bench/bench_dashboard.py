"""Dashboard render time with 1,000 commits × 5 backends stored, against an empty grid.

Rows are generated directly through the models (bulk inserts on SQLite, or any
``--database-url``): per commit a delivery and a change; per backend a run with its
stored selection (a small plan), one shard and its test results, a few of them
failing or flaky. Each page is then requested through the real app in-process
(FastAPI's test client: routing, queries, Jinja rendering, no network) and the
median compared with the same page over an empty database in the same run.

    python bench/bench_dashboard.py [--commits 1000] [--backends 5] [--repeat 30]

The empty grid renders no rows, so that ratio is what showing 50 × 5 cells costs; the
second baseline, a store holding exactly one page, shows whether the time grows with
what is stored (it must not: queries are aggregated, paginated and indexed).
Goal: grid median under 100 ms with 1,000 × 5 stored, within 1.5× of the one-page store.

A run of real size (issue 27): one more run with ``--failures`` failures (default 1,200, each
with a 20 KB traceback) is stored beside them; its run page, a later page of its failures
(the cursor) and its JSON view are timed next to the run page of an ordinary run, with their
sizes, and the first page is loaded in Chromium (``--browser``) to time its rendering.
Goal: under 1 MB and rendered in under a second.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import insert, select, text

from ci_relay.context import RelayContext
from ci_relay.service.app import create_app
from ci_relay.settings import Settings
from ci_relay.store.models import Change, Delivery, Run, Selection, Shard, TestResult

BACKENDS = ["cpu", "spyre", "spyre-emu", "cuda", "xpu", "mps", "hpu", "npu"]
TESTS_PER_RUN = 20
PER_PAGE = 50  # the grid's default page
# what the test, commit and PR pages look rows up by (left to a migration)
SUGGESTED_INDEXES = (
    "CREATE INDEX ix_test_results_nodeid ON test_results (nodeid)",
    "CREATE INDEX ix_changes_head_sha ON changes (head_sha)",
    "CREATE INDEX ix_changes_number ON changes (number)",
)
START = datetime(2026, 1, 1, tzinfo=UTC)


def sha(n: int) -> str:
    """A commit id that looks like one (distinct in its first characters, like real ones)."""
    return hashlib.sha1(str(n).encode()).hexdigest()


def _plan(i: int) -> dict[str, Any]:
    def item(n: int, shard: int | None) -> dict[str, Any]:
        test = f"test/test_ops_{n % 40}.py::TestOps::test_case_{n}"
        evidence = [
            {"stage": "candidates", "source": "references-change", "score": 0.9, "reason": "op"},
            {"stage": "agent", "source": "local", "score": 0.3, "reason": "similar (cos 0.6)"},
        ]
        return {
            "test": test,
            "file": test.split("::")[0],
            "score": 1.2,
            "reasons": ["op", "similar (cos 0.6)"],
            "evidence": evidence,
            "duration": 2.0,
            "shard": shard,
            "mode": "mandatory_success",
        }

    return {
        "base": sha(i - 1),
        "head": sha(i),
        "budget": "15%",
        "agent": "local",
        "universe_size": 2000,
        "selected": [item(i + n, 0) for n in range(10)],
        "excluded": [item(i + 100 + n, None) for n in range(10)],
        "shards": [[f"t{n}" for n in range(10)]],
        "change": {"files": [], "symbols": [], "ops": ["add"]},
        "notes": [],
    }


def populate(rt: RelayContext, commits: int, backends: list[str]) -> None:
    """Bulk-insert the rows the pipeline would have stored for ``commits`` × ``backends``."""
    with rt.db.session() as session:
        deliveries, changes, runs, selections, shards, results = [], [], [], [], [], []
        run_id = shard_id = 0
        for c in range(1, commits + 1):
            at = START + timedelta(minutes=10 * c)
            head = sha(c)
            deliveries.append(
                {
                    "id": c,
                    "source": "github",
                    "hook_id": "1",
                    "delivery_id": f"bench-{c}",
                    "event": "pull_request",
                    "action": "synchronize",
                    "repository": "pytorch/pytorch",
                    "head_sha": head,
                    "state": "processed",
                    "body": b'{"pull_request": {"title": "bench change"}}',
                    "received_at": at,
                }
            )
            changes.append(
                {
                    "id": c,
                    "delivery_pk": c,
                    "repository": "pytorch/pytorch",
                    "kind": "pull_request",
                    "number": 1000 + c // 3,
                    "head_sha": head,
                    "base_sha": sha(c - 1),
                    "labels": [],
                    "created_at": at,
                }
            )
            for b, backend in enumerate(backends):
                run_id += 1
                shard_id += 1
                finished = c < commits - 2
                failing = (c + b) % 7 == 0
                counts = (
                    {"passed": TESTS_PER_RUN - 1, "failed": 1}
                    if failing
                    else {"passed": TESTS_PER_RUN}
                )
                runs.append(
                    {
                        "id": run_id,
                        "change_id": c,
                        "backend": backend,
                        "attempt": 1,
                        "level": "L2",
                        "state": "completed" if finished else "running",
                        "conclusion": ("failure" if failing else "success") if finished else None,
                        "counts": counts if finished else {},
                        "created_at": at,
                        "started_at": at,
                        "finished_at": at + timedelta(minutes=5) if finished else None,
                    }
                )
                selections.append(
                    {"run_id": run_id, "strategy": "four-stage/local", "plan": _plan(c)}
                )
                shards.append(
                    {
                        "id": shard_id,
                        "run_id": run_id,
                        "index": 0,
                        "test_files": [f"t{n}" for n in range(TESTS_PER_RUN)],
                        "state": "done",
                        "attempts": 1,
                        "exit_code": 1 if failing else 0,
                        "log_tail": "runtime local\n" * 20,
                        "started_at": at,
                        "finished_at": at + timedelta(minutes=4),
                    }
                )
                for n in range(TESTS_PER_RUN):
                    outcome = "failed" if failing and n == 0 else "passed"
                    if n == 1 and (c + b) % 11 == 0:
                        outcome = "flaky"
                    results.append(
                        {
                            "shard_id": shard_id,
                            "nodeid": f"test/test_ops_{n}.py::TestOpsCPU::test_case_{n}_cpu",
                            "outcome": outcome,
                            "mode": "mandatory_success",
                            "duration": 0.01 * (n + 1),
                            "message": "AssertionError: not equal" if outcome != "passed" else None,
                        }
                    )
        for model, rows in (
            (Delivery, deliveries),
            (Change, changes),
            (Run, runs),
            (Selection, selections),
            (Shard, shards),
            (TestResult, results),
        ):
            for start in range(0, len(rows), 5000):
                session.execute(insert(model), rows[start : start + 5000])


def add_large_run(rt: RelayContext, failures: int) -> int:
    """A finished run whose every result failed, each with a long traceback; its id."""
    frames = "".join(
        f'  File "torch/testing/_internal/f{k}.py", line {k}, in f{k}\n' for k in range(350)
    )
    with rt.db.session() as session:
        delivery = Delivery(
            source="github",
            hook_id="bench",
            delivery_id="large-run",
            event="push",
            repository="sample/pytorch",
            head_sha="f" * 40,
            state="processed",
            body=b"{}",
            received_at=START,
        )
        change = Change(
            delivery=delivery, repository="sample/pytorch", kind="push", head_sha="f" * 40
        )
        run = Run(change=change, backend="cpu", level="L2", state="completed", conclusion="failure")
        shard = Shard(run=run, index=0, test_files=["test/test_unary_ufuncs.py"], state="done")
        session.add(shard)
        session.flush()
        session.execute(
            insert(TestResult),
            [
                {
                    "shard_id": shard.id,
                    "nodeid": f"test/test_unary_ufuncs.py::TestUnaryUfuncsCPU::test_case_{i}_cpu",
                    "outcome": "failed",
                    "mode": "mandatory_success",
                    "duration": 0.5,
                    "message": f"AssertionError: Tensor-likes are not close! (case {i})",
                    "details": f"Traceback (most recent call last):\n{frames}AssertionError: {i}",
                }
                for i in range(failures)
            ],
        )
        return int(run.id)


def render_seconds(html: str, repeat: int) -> float | None:
    """Median seconds Chromium takes to parse, lay out and paint ``html`` (no network)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    samples = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
        page = browser.new_page()
        for _ in range(repeat + 1):
            start = time.perf_counter()
            page.set_content(html, wait_until="load")
            page.evaluate("document.body.getBoundingClientRect().height")  # forces layout
            samples.append(time.perf_counter() - start)
        browser.close()
    return statistics.median(samples[1:])


def timed(get: Callable[[], Any], repeat: int) -> list[float]:
    get()  # warm: template compilation, connection pool, SQLite page cache
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = get()
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200, response.text[:300]
    return samples


def app_for(url: str, data: Path) -> tuple[RelayContext, TestClient]:
    # the stored runs start on START: a window of a year holds them all (L3 readiness)
    settings = Settings(
        database_url=url, data_dir=data, webhook_secret="bench", health_window_days=365
    )
    rt = RelayContext(settings)
    rt.db.upgrade()
    return rt, TestClient(create_app(rt, lambda steps: None))


def _line(label: str, samples: list[float], baseline: float) -> float:
    samples = sorted(samples)
    median = statistics.median(samples)
    p95 = samples[min(len(samples) - 1, int(0.95 * len(samples)))]
    print(f"{label[:48]:48} {median * 1000:8.1f}ms {p95 * 1000:8.1f}ms {median / baseline:9.2f}x")
    return median


def _print_health(health: dict[str, Any]) -> None:
    """What L3 readiness says of the generated store (every run a pull request's, at L2)."""
    print(f"L3 readiness over {health['window_days']} days:")
    for b in health["backends"]:
        figures = {f["key"]: f["value"] for f in b["figures"]}
        shown = ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()
        )
        print(f"  {b['backend']}: {b['level']}, {b['runs']} runs, {b['state']}; {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--backends", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--database-url", help="for the full store (default: a new SQLite file)")
    parser.add_argument(
        "--suggested-indexes",
        action="store_true",
        help="add the indexes the dashboard would like (not yet in a migration) first",
    )
    parser.add_argument("--failures", type=int, default=1200, help="of the large run")
    parser.add_argument("--browser", action="store_true", help="time its rendering in Chromium")
    args = parser.parse_args()
    backends = BACKENDS[: args.backends]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        empty_rt, empty = app_for(f"sqlite:///{root / 'empty.db'}", root / "empty")
        page_rt, one_page = app_for(f"sqlite:///{root / 'page.db'}", root / "page")
        populate(page_rt, PER_PAGE, backends)
        full_rt, full = app_for(args.database_url or f"sqlite:///{root / 'full.db'}", root / "full")
        start = time.perf_counter()
        populate(full_rt, args.commits, backends)
        if args.suggested_indexes:
            with full_rt.db.session() as session:
                for statement in SUGGESTED_INDEXES:
                    session.execute(text(statement))
            print("with the suggested indexes: " + "; ".join(SUGGESTED_INDEXES))
        print(
            f"stored {args.commits} commits × {len(backends)} backends "
            f"({args.commits * len(backends)} runs, "
            f"{args.commits * len(backends) * TESTS_PER_RUN} results) "
            f"in {time.perf_counter() - start:.1f}s"
        )
        with full_rt.db.session() as session:
            some_run = session.scalar(select(Run.id).where(Run.conclusion == "failure"))
        print(f"{'page':48} {'median':>10} {'p95':>10} {'vs empty':>10}")
        baseline = statistics.median(timed(lambda: empty.get("/"), args.repeat))
        _line("/ with nothing stored", [baseline], baseline)
        page_only = _line(
            f"/ with one page stored ({PER_PAGE} commits)",
            timed(lambda: one_page.get("/"), args.repeat),
            baseline,
        )
        grid = _line(
            f"/ with {args.commits} commits stored",
            timed(lambda: full.get("/"), args.repeat),
            baseline,
        )
        pages = [
            "/api/grid",
            "/?page=10",
            "/?per_page=200",
            f"/commits/{sha(args.commits)}",
            f"/runs/{some_run}",
            "/tests?nodeid=test/test_ops_0.py::TestOpsCPU::test_case_0_cpu",
            "/trends",
            "/health",
            "/api/health",
            "/metrics",
        ]
        for url in pages:
            _line(url, timed(lambda url=url: full.get(url), args.repeat), baseline)  # type: ignore[misc]
        _print_health(full.get("/api/health").json())
        big = add_large_run(full_rt, args.failures)
        ordinary = full.get(f"/runs/{some_run}").text
        print(
            f"\na run with {args.failures} failures (20 KB of text each) against run {some_run} "
            f"({len(ordinary.encode()) / 1024:.0f} KB page):"
        )
        baseline_run = statistics.median(timed(lambda: full.get(f"/runs/{some_run}"), args.repeat))
        # the next page's cursor (a relay from before the cursor shows every failure at once)
        cursor = full.get(f"/api/runs/{big}/view").json()["run"].get("failures_next")
        urls = [f"/runs/{big}", f"/api/runs/{big}/view"]
        if cursor:
            urls.insert(1, f"/runs/{big}?failures_after={cursor}")
        for url in urls:
            size = len(full.get(url).content)
            _line(url, timed(lambda url=url: full.get(url), args.repeat), baseline_run)  # type: ignore[misc]
            print(f"{'':48} {size / 1024:8.0f} KB (ratio: against the ordinary run page)")
        if args.browser:
            seconds = render_seconds(full.get(f"/runs/{big}").text, min(args.repeat, 10))
            plain = render_seconds(ordinary, min(args.repeat, 10))
            if seconds is not None and plain is not None:
                print(
                    f"Chromium renders the large run's page in {seconds * 1000:.0f} ms "
                    f"(the ordinary run's page: {plain * 1000:.0f} ms, {seconds / plain:.2f}x)"
                )
        print(
            f"grid, {args.commits} commits × {len(backends)} backends stored: "
            f"{grid * 1000:.1f} ms median = {grid / baseline:.2f}x the empty grid, "
            f"{grid / page_only:.2f}x the grid with only one page stored"
        )
        for rt in (empty_rt, page_rt, full_rt):
            rt.db.dispose()


if __name__ == "__main__":
    main()
