"""Report throughput when the endpoint is slow: the real sender against a 200 ms endpoint
and against an instant one, in the same run.

N completed runs (each with 20 results, 2 of them failures with a 2 KB traceback) get one
pending CRCR report each in the outbox, on SQLite (or ``--database-url``). They are sent
by the real sender (``ci_relay.reporting.sender``: claim, render from the database, POST,
record) to a loopback HTTP server that answers 200 at once, then to one that sleeps
``--delay`` seconds per request first; the rows are reset to pending between passes.

Two ways of sending, as the relay does:

* ``sweep``: ``sender.deliver_due`` — one caller, one shared HTTP client, one message
  after another (what a sweep after a restart does in one thread);
* ``tasks xW``: W threads each calling ``sender.deliver(rt, id)`` with no client, as the
  ``relay.send_report`` Celery task does: one message per task, sent with the thread's
  kept HTTP client; W = the worker's ``--concurrency`` (a thread pool: ``ci-relay worker``
  defaults to 2, and the same threads also run intake, select and collect);
* ``... new client``: the same with a new ``httpx.Client`` per report (what the sender did
  before it kept one per thread: ~35 ms of CPU each for the TLS context).

A slow endpoint bounds each sender at 1/delay reports per second, so throughput is
W/delay at best; the ratio shows how much of that the relay reaches and what one slow
target costs.

    python bench/bench_reports.py [--reports 100] [--delay 0.2] [--workers 2,8]
"""

from __future__ import annotations

import argparse
import json
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, insert, select, update

from ci_relay.context import RelayContext
from ci_relay.reporting import sender
from ci_relay.settings import Settings
from ci_relay.store.models import (
    Change,
    Delivery,
    OutboxMessage,
    OutboxState,
    Run,
    Shard,
    TestResult,
    utcnow,
)

TESTS_PER_RUN = 20
FAILURES_PER_RUN = 2
TRACEBACK = "\n".join(f'  File "torch/_refs/__init__.py", line {n}, in op_{n}' for n in range(40))


class _Server(ThreadingHTTPServer):
    daemon_threads = True


@contextmanager
def endpoint(delay: float) -> Iterator[tuple[str, list[int]]]:
    """A CRCR callback receiver on loopback answering 200 after ``delay`` seconds; every
    request is served in its own thread, so the server never queues the senders."""
    received: list[int] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a shared client reuses its connection
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms ACK wait

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if delay:
                time.sleep(delay)
            with lock:
                received.append(len(body))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "11")
            self.end_headers()
            self.wfile.write(b'{"ok":true}')

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/callback", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def populate(rt: RelayContext, reports: int) -> None:
    """``reports`` completed runs, each with results and one CRCR outbox row."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    deliveries, changes, runs, shards, results, outbox = [], [], [], [], [], []
    for n in range(1, reports + 1):
        head = f"{n:040x}"
        at = start + timedelta(minutes=n)
        body = json.dumps(
            {
                "action": "synchronize",
                "number": n,
                "pull_request": {"number": n, "head": {"sha": head}},
                "repository": {"full_name": "pytorch/pytorch"},
            }
        )
        deliveries.append(
            {
                "id": n,
                "source": "github",
                "hook_id": "1",
                "delivery_id": f"bench-{n}",
                "event": "pull_request",
                "action": "synchronize",
                "repository": "pytorch/pytorch",
                "head_sha": head,
                "state": "processed",
                "body": body.encode(),
                "received_at": at,
            }
        )
        changes.append(
            {
                "id": n,
                "delivery_pk": n,
                "repository": "pytorch/pytorch",
                "kind": "pull_request",
                "number": n,
                "head_sha": head,
                "labels": [],
                "created_at": at,
            }
        )
        counts = {"passed": TESTS_PER_RUN - FAILURES_PER_RUN, "failed": FAILURES_PER_RUN}
        runs.append(
            {
                "id": n,
                "change_id": n,
                "backend": "cpu",
                "attempt": 1,
                "level": "L2",
                "state": "completed",
                "conclusion": "failure",
                "counts": counts,
                "created_at": at,
                "started_at": at,
                "finished_at": at + timedelta(minutes=5),
            }
        )
        shards.append(
            {"id": n, "run_id": n, "index": 0, "test_files": [], "state": "done", "exit_code": 1}
        )
        for t in range(TESTS_PER_RUN):
            failed = t < FAILURES_PER_RUN
            results.append(
                {
                    "shard_id": n,
                    "nodeid": f"test/test_ops.py::TestOpsCPU::test_{t}_cpu",
                    "outcome": "failed" if failed else "passed",
                    "duration": 0.1,
                    "message": "AssertionError: Tensor-likes are not close!" if failed else None,
                    "details": f"Traceback (most recent call last):\n{TRACEBACK}\nAssertionError"
                    if failed
                    else None,
                }
            )
        outbox.append({"id": n, "run_id": n, "target": "crcr", "payload": {"event": "completed"}})
    with rt.db.session() as session:
        for model, rows in (
            (Delivery, deliveries),
            (Change, changes),
            (Run, runs),
            (Shard, shards),
            (TestResult, results),
            (OutboxMessage, outbox),
        ):
            session.execute(insert(model), rows)


def reset(rt: RelayContext) -> None:
    """Every report pending and due again, as if never sent."""
    with rt.db.session() as session:
        session.execute(
            update(OutboxMessage).values(
                state=OutboxState.PENDING,
                attempts=0,
                next_attempt_at=utcnow() - timedelta(seconds=1),
                sent_at=None,
                result=None,
                last_error=None,
            )
        )


def sweep(rt: RelayContext) -> None:
    sender.deliver_due(rt)


def tasks(workers: int, new_client: bool = False) -> Callable[[RelayContext], None]:
    """W threads, each taking the next message id and sending it as the Celery task does."""

    def send_all(rt: RelayContext) -> None:
        with rt.db.session() as session:
            ids: queue.SimpleQueue[int] = queue.SimpleQueue()
            for pk in session.scalars(select(OutboxMessage.id).order_by(OutboxMessage.id)):
                ids.put(pk)

        def work() -> None:
            while True:
                try:
                    pk = ids.get_nowait()
                except queue.Empty:
                    return
                if new_client:
                    with httpx.Client(timeout=rt.settings.report_timeout_seconds) as client:
                        sender.deliver(rt, pk, client=client)
                else:
                    sender.deliver(rt, pk)

        threads = [threading.Thread(target=work) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    return send_all


def measure(
    rt: RelayContext, url: str, received: list[int], send: Callable[[RelayContext], None]
) -> float:
    """Reports per second for one pass over every row; checks each was sent exactly once."""
    reset(rt)
    rt.settings.crcr_callback_url = url
    received.clear()
    start = time.perf_counter()
    send(rt)
    elapsed = time.perf_counter() - start
    with rt.db.session() as session:
        sent = session.scalar(select(func.count()).where(OutboxMessage.state == OutboxState.SENT))
        total = session.scalar(select(func.count()).select_from(OutboxMessage))
    if sent != total or len(received) != total:
        raise SystemExit(f"{sent} of {total} sent, {len(received)} received: the bench is wrong")
    return float(total or 0) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=100)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the slow endpoint waits")
    parser.add_argument("--workers", default="2,8", help="task-style sender threads to try")
    parser.add_argument("--database-url", help="default: a new SQLite file (the embedded mode)")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",") if w]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=args.database_url or f"sqlite:///{Path(tmp) / 'relay.db'}",
            data_dir=Path(tmp) / "data",
            webhook_secret="bench",
            crcr_callback_url="http://127.0.0.1:9/unset",
            report_timeout_seconds=30,
        )
        rt = RelayContext(settings)
        rt.db.upgrade()
        populate(rt, args.reports)
        body_bytes: list[int] = []
        print(
            f"{args.reports} CRCR reports ({TESTS_PER_RUN} results, {FAILURES_PER_RUN} failures "
            f"with tracebacks each) on {rt.db.engine.url.get_backend_name()}; slow endpoint: "
            f"{args.delay * 1000:.0f} ms per request"
        )
        print(f"{'sender':16} {'instant':>12} {'slow':>12} {'slow/instant':>13} {'bound':>10}")
        modes: list[tuple[str, Callable[[RelayContext], None], int]] = [("sweep", sweep, 1)]
        modes += [(f"tasks x{w}", tasks(w), w) for w in workers]
        modes += [(f"x{w} new client", tasks(w, new_client=True), w) for w in workers[:1]]
        with endpoint(0.0) as (fast_url, fast_seen), endpoint(args.delay) as (slow_url, slow_seen):
            for label, send, concurrency in modes:
                measure(rt, fast_url, fast_seen, send)  # warm: connections, page cache
                instant = measure(rt, fast_url, fast_seen, send)
                body_bytes = list(fast_seen)
                slow = measure(rt, slow_url, slow_seen, send)
                bound = concurrency / args.delay
                print(
                    f"{label:16} {instant:10.1f}/s {slow:10.1f}/s {slow / instant:12.3f}x "
                    f"{bound:8.1f}/s"
                )
        print(
            f"bodies {min(body_bytes)}-{max(body_bytes)} bytes; bound = senders / delay "
            "(a sender waits for each answer before the next report)"
        )
        rt.db.dispose()


if __name__ == "__main__":
    main()
