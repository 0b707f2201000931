"""Webhook intake under load: sustained deliveries/s and p50/p99 ack latency.

A load generator on loopback sends signed real payloads (``tests/data/github``)
at a fixed rate to (1) a bare FastAPI endpoint that only answers 202 and (2) the
relay on SQLite with the embedded broker and on PostgreSQL with Redis, each in
its own uvicorn process, and counts the stored rows afterwards (loss). Bounded:
a fixed number of requests per target. Goal: p99 ack under 25 ms at 200/s, zero loss.

``--previous REV`` also measures the intake as it was at REV (a git worktree of this
repository, imported instead of the installed package) against this tree, on SQLite, in
the same run and in alternating order: at the fixed rate (p50/p99) and saturated (as fast
as 32 connections can send). That is how the cost of intake validation is measured
(goal: no more than 5 % slower than REV, the commit before it).
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
FIXTURE = ROOT / "tests" / "data" / "github" / "pull_request" / "synchronize.payload.json"
SECRET = "bench-secret"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
WARM_UP = 50  # deliveries sent (and stored) before measuring


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _load(
    port: int, rate: float | None, count: int, body: bytes
) -> tuple[list[float], float, int]:
    """``count`` deliveries at ``rate`` per second, or (None) 32 at a time as fast as they go."""
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
        if rate is None:
            gate = asyncio.Semaphore(32)

            async def gated() -> None:
                async with gate:
                    await one()

            await asyncio.gather(*(gated() for _ in range(count)))
        else:
            for i in range(count):
                delay = started + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one()))
            await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    return latencies, elapsed, failures


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time the server process has used so far (less noisy than wall time)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(
    mode: str, env: dict[str, str], tree: Path = ROOT
) -> tuple[subprocess.Popen[bytes], int]:
    """The server of ``tree``'s code: another tree is put first on the import path."""
    port = free_port()
    extra = {"PYTHONPATH": str(tree)} if tree != ROOT else {}
    proc = subprocess.Popen(
        [sys.executable, str(tree / "bench" / "intake_server.py"), mode, "--port", str(port)],
        env={**os.environ, **env, **extra},
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
    name: str,
    mode: str,
    env: dict[str, str],
    rate: float | None,
    count: int,
    db_url: str | None,
    tree: Path = ROOT,
) -> float:
    proc, port = _serve(mode, env, tree)
    try:
        body = FIXTURE.read_bytes()
        asyncio.run(_load(port, None, WARM_UP, body))  # first requests import and connect
        cpu_before = _cpu_seconds(proc.pid)
        latencies, elapsed, failures = asyncio.run(_load(port, rate, count, body))
        cpu = (_cpu_seconds(proc.pid) - cpu_before) / count
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    stored = "-"
    if db_url:
        engine = create_engine(db_url)
        with engine.connect() as conn:
            stored = str(conn.scalar(select(func.count()).select_from(Delivery)) - WARM_UP)
        engine.dispose()
    p50, p99 = _percentile(latencies, 0.50) * 1000, _percentile(latencies, 0.99) * 1000
    lost = "" if stored == "-" else f", stored {stored}/{count} (lost {count - int(stored)})"
    print(
        f"{name:<28} {len(latencies) / elapsed:7.1f} deliveries/s  p50 {p50:6.1f} ms  "
        f"p99 {p99:6.1f} ms  server CPU {cpu * 1000:5.2f} ms/delivery  non-202 {failures}{lost}"
    )
    _LAST.update(rate=len(latencies) / elapsed, p50=p50, cpu=cpu)
    return p99


_LAST: dict[str, float] = {}


def _pg_floor(url: str, rate: float, count: int, body: bytes) -> float:
    """PostgreSQL's own floor on this machine: one INSERT of the same body and its durable
    COMMIT per delivery, from a thread pool at the same rate, no HTTP and no relay. A relay
    p99 near this is PostgreSQL's commit (its WAL flush), not the relay's request path."""
    engine = create_engine(url, pool_size=10, max_overflow=20)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE floor (id bigserial PRIMARY KEY, body bytea)"))

    def write() -> float:
        start = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO floor (body) VALUES (:b)"), {"b": body})
        return time.perf_counter() - start

    async def load() -> list[float]:
        started = time.perf_counter()
        tasks = []
        for i in range(WARM_UP + count):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(asyncio.to_thread(write)))
        return list(await asyncio.gather(*tasks))[WARM_UP:]

    latencies = asyncio.run(load())
    engine.dispose()
    p50, p99 = _percentile(latencies, 0.50) * 1000, _percentile(latencies, 0.99) * 1000
    print(
        f"{'PostgreSQL INSERT+COMMIT':<28} {'':>22}p50 {p50:6.1f} ms  "
        f"p99 {p99:6.1f} ms  (the floor: no HTTP, no relay)"
    )
    return p99


def _validation_cost(tree: Path, rounds: int = 7, per_round: int = 2000) -> None:
    """The intake's reading of one delivery, in-process: this tree (header checks, strict
    JSON, summarize with every identifier checked) against ``tree``'s (json.loads and its
    summarize), alternating, on the real payload. Precise where the servers are noisy."""
    import importlib.util
    import timeit

    from ci_relay.identifiers import delivery_id, event_name, hook_id
    from ci_relay.intake.events import summarize
    from ci_relay.request_body import parse_json

    spec = importlib.util.spec_from_file_location(
        "previous_events", tree / "ci_relay" / "intake" / "events.py"
    )
    assert spec is not None and spec.loader is not None
    previous = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = previous  # dataclasses look their module up while it loads
    spec.loader.exec_module(previous)
    body = FIXTURE.read_bytes()
    uuid_text = str(uuid.uuid4())

    def now() -> None:
        event_name("pull_request"), delivery_id(uuid_text), hook_id("1")
        summarize("pull_request", parse_json(body))

    def before() -> None:
        previous.summarize("pull_request", json.loads(body))

    times: dict[str, list[float]] = {"now": [], "before": []}
    for _ in range(rounds):
        times["before"].append(timeit.timeit(before, number=per_round) / per_round)
        times["now"].append(timeit.timeit(now, number=per_round) / per_round)
    t_now, t_before = min(times["now"]), min(times["before"])
    print(
        f"reading one delivery in-process ({len(body):,}-byte pull_request, best of {rounds}): "
        f"this tree {t_now * 1e6:.0f} us, previous {t_before * 1e6:.0f} us, "
        f"{t_now / t_before:.2f}x; validation adds {(t_now - t_before) * 1e6:.0f} us"
    )
    _LAST.update(read_now=t_now, read_before=t_before)


def _compare_previous(rev: str, count: int, rate: float, rounds: int) -> None:
    """This tree against ``rev`` on SQLite: fixed-rate p50 and saturated deliveries/s."""
    with tempfile.TemporaryDirectory(prefix="bench-intake-prev-") as tmp:
        tree = Path(tmp) / "previous"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--", str(tree), rev],
            check=True,
            capture_output=True,
        )
        try:
            _validation_cost(tree)
            policy = Path(tmp) / "policy.yaml"
            policy.write_text(
                "repositories:\n  Codertocat/Hello-World:\n    backends:\n      cpu: {level: L2}\n"
            )
            figures: dict[str, dict[str, list[float]]] = {}
            for n in range(rounds):
                order = [("previous", tree), ("this tree", ROOT)]
                for label, where in order if n % 2 == 0 else order[::-1]:
                    for load in (rate, None):
                        url = f"sqlite:///{tmp}/{label.replace(' ', '-')}-{n}-{load}.db"
                        env = {
                            "CI_RELAY_WEBHOOK_SECRET": SECRET,
                            "CI_RELAY_POLICY_FILE": str(policy),
                            "CI_RELAY_DATABASE_URL": url,
                            "CI_RELAY_DATA_DIR": f"{tmp}/data-{label.replace(' ', '-')}-{n}",
                        }
                        what = f"{rate:.0f}/s" if load else "saturated"
                        _run(f"{label} ({what})", "relay", env, load, count, url, where)
                        for key in ("p50", "cpu") if load else ("rate", "cpu"):
                            figures.setdefault(label, {}).setdefault(key, []).append(_LAST[key])
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", "--", str(tree)],
                check=False,
                capture_output=True,
            )

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    p50 = median(figures["this tree"]["p50"]) / median(figures["previous"]["p50"])
    speed = median(figures["previous"]["rate"]) / median(figures["this tree"]["rate"])
    cpu = median(figures["this tree"]["cpu"]) / median(figures["previous"]["cpu"])
    print(
        f"this tree vs {rev} (medians of {rounds} rounds, {2 * rounds} runs for CPU): "
        f"server CPU per delivery {cpu:.3f}x, p50 at {rate:.0f}/s {p50:.3f}x, "
        f"wall time per delivery when saturated {speed:.3f}x (goal: <= 1.05)"
    )
    added = _LAST["read_now"] - _LAST["read_before"]
    server_cpu = median(figures["previous"]["cpu"])
    print(
        f"validation's share: {added * 1e6:.0f} us of {server_cpu * 1e6:.0f} us server CPU "
        f"per delivery = {1 + added / server_cpu:.3f}x (goal: <= 1.05)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument(
        "--previous",
        metavar="REV",
        help="also compare this tree's intake with REV's (e.g. the commit before a change)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --previous")
    parser.add_argument(
        "--no-publish",
        action="store_true",
        help="diagnosis: the relay stores each delivery but publishes no queue message",
    )
    args = parser.parse_args()
    if args.previous:
        _compare_previous(args.previous, args.count, args.rate, args.rounds)
        return
    print(
        f"{args.count} signed pull_request deliveries per target at {args.rate:.0f}/s on loopback"
    )
    with tempfile.TemporaryDirectory(prefix="bench-intake-") as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(
            "repositories:\n  Codertocat/Hello-World:\n    backends:\n      cpu: {level: L2}\n"
        )
        base = {"CI_RELAY_WEBHOOK_SECRET": SECRET, "CI_RELAY_POLICY_FILE": str(policy)}
        if args.no_publish:
            base["BENCH_NO_PUBLISH"] = "1"
            print("(diagnosis: no queue message is published)")
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
            floor = _pg_floor(pg_url, args.rate, args.count, FIXTURE.read_bytes())
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
        f"PostgreSQL {postgres / bare:.1f}x (goal: p99 < 25 ms); PostgreSQL's own "
        f"INSERT+COMMIT p99 {floor:.1f} ms"
    )
    print(json.dumps({"bare_p99_ms": bare, "sqlite_p99_ms": sqlite, "postgres_p99_ms": postgres}))


if __name__ == "__main__":
    main()
