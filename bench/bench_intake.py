"""Webhook intake under load: sustained deliveries/s and p50/p99 ack latency.

A load generator on loopback sends signed real payloads (``../shared/fixtures``)
at a fixed rate to (1) a bare FastAPI endpoint that only answers 202 and (2) the
relay on SQLite with the embedded broker and on PostgreSQL with Redis, each in
its own uvicorn process, and counts the stored rows afterwards (loss). Bounded:
a fixed number of requests per target. Goal: p99 ack under 25 ms at 200/s, zero loss.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy import create_engine, func, select, text

from ci_relay.demo import free_port
from ci_relay.intake.signature import sign
from ci_relay.store.models import Delivery

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = (
    ROOT.parent / "shared" / "fixtures" / "github" / "pull_request" / "synchronize.payload.json"
)
SECRET = "bench-secret"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _load(port: int, rate: float, count: int, body: bytes) -> tuple[list[float], float, int]:
    latencies: list[float] = []
    failures = 0
    signature = sign(SECRET, body)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30
    ) as client:

        async def one() -> None:
            nonlocal failures
            headers = {
                "X-GitHub-Event": "pull_request",
                "X-GitHub-Delivery": str(uuid.uuid4()),
                "X-GitHub-Hook-ID": "1",
                "X-Hub-Signature-256": signature,
                "Content-Type": "application/json",
            }
            start = time.perf_counter()
            response = await client.post("/webhooks/github", content=body, headers=headers)
            latencies.append(time.perf_counter() - start)
            if response.status_code != 202:
                failures += 1

        tasks = []
        started = time.perf_counter()
        for i in range(count):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    return latencies, elapsed, failures


def _serve(mode: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "intake_server.py"), mode, "--port", str(port)],
        env={**os.environ, **env},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{mode} server did not start")


def _run(
    name: str, mode: str, env: dict[str, str], rate: float, count: int, db_url: str | None
) -> float:
    proc, port = _serve(mode, env)
    try:
        body = FIXTURE.read_bytes()
        latencies, elapsed, failures = asyncio.run(_load(port, rate, count, body))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    stored = "-"
    if db_url:
        engine = create_engine(db_url)
        with engine.connect() as conn:
            stored = str(conn.scalar(select(func.count()).select_from(Delivery)))
        engine.dispose()
    p50, p99 = _percentile(latencies, 0.50) * 1000, _percentile(latencies, 0.99) * 1000
    lost = "" if stored == "-" else f", stored {stored}/{count} (lost {count - int(stored)})"
    print(
        f"{name:<28} {len(latencies) / elapsed:7.1f} deliveries/s  p50 {p50:6.1f} ms  "
        f"p99 {p99:6.1f} ms  non-202 {failures}{lost}"
    )
    return p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args()
    print(
        f"{args.count} signed pull_request deliveries per target at {args.rate:.0f}/s on loopback"
    )
    with tempfile.TemporaryDirectory(prefix="bench-intake-") as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(
            "repositories:\n  Codertocat/Hello-World:\n    backends:\n      cpu: {level: L2}\n"
        )
        base = {"CI_RELAY_WEBHOOK_SECRET": SECRET, "CI_RELAY_POLICY_FILE": str(policy)}
        bare = _run("bare FastAPI 202", "bare", {}, args.rate, args.count, None)
        sqlite_url = f"sqlite:///{tmp}/relay.db"
        sqlite = _run(
            "relay, SQLite + embedded",
            "relay",
            {**base, "CI_RELAY_DATABASE_URL": sqlite_url, "CI_RELAY_DATA_DIR": f"{tmp}/data"},
            args.rate,
            args.count,
            sqlite_url,
        )
        name = f"bench_intake_{uuid.uuid4().hex[:8]}"
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        pg_url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
        try:
            postgres = _run(
                "relay, PostgreSQL + Redis",
                "relay",
                {
                    **base,
                    "CI_RELAY_DATABASE_URL": pg_url,
                    "CI_RELAY_BROKER_URL": "redis://127.0.0.1:6379/14",
                    "CI_RELAY_DATA_DIR": f"{tmp}/data-pg",
                },
                args.rate,
                args.count,
                pg_url,
            )
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            import redis

            redis.Redis(db=14).flushdb()
    print(
        f"p99 ratio relay/bare: SQLite {sqlite / bare:.1f}x, "
        f"PostgreSQL {postgres / bare:.1f}x (goal: p99 < 25 ms)"
    )
    print(json.dumps({"bare_p99_ms": bare, "sqlite_p99_ms": sqlite, "postgres_p99_ms": postgres}))


if __name__ == "__main__":
    main()
