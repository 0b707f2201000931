"""The store's SQLite tuning: the API's commits never pay for WAL checkpoints; a background
thread of the API process does them (checked on a real database file)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from sqlalchemy import text

from ci_relay.store.database import Database


def _checkpointed_rows(path: Path) -> int:
    """Rows the database file itself holds: what a checkpoint copied out of the WAL."""
    reader = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return int(reader.execute("SELECT count(*) FROM t").fetchone()[0])
    except sqlite3.OperationalError:  # the table itself is still only in the WAL
        return -1
    except sqlite3.DatabaseError:  # read mid-checkpoint: the file is being written
        return -2
    finally:
        reader.close()


def test_commits_leave_wal_checkpoints_to_a_background_thread(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    db = Database(f"sqlite:///{path}")
    with db.session() as s:
        s.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)"))
        s.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))  # the table is in the file
    stop = db.defer_checkpoints(every=3600)  # its first pass is an hour away
    assert stop is not None
    try:
        with db.session() as s:
            assert s.execute(text("PRAGMA wal_autocheckpoint")).scalar() == 0
        for _ in range(40):  # 5 MB, past the 1,000 pages at which a commit would checkpoint
            with db.session() as s:
                s.execute(text("INSERT INTO t (body) VALUES (:b)"), {"b": b"x" * 128_000})
        assert _checkpointed_rows(path) == 0  # every row is still only in the WAL
    finally:
        stop.set()  # the thread's last pass copies them into the database file
    deadline = time.monotonic() + 30
    while _checkpointed_rows(path) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _checkpointed_rows(path) == 40
    db.dispose()


def test_postgresql_has_nothing_to_defer(database_url: str) -> None:
    db = Database(database_url)
    stop = db.defer_checkpoints()
    assert (stop is None) == database_url.startswith("postgresql")
    if stop is not None:
        stop.set()
    db.dispose()


UPGRADER = """
import sys, time
from pathlib import Path
from ci_relay.store.database import Database
db = Database(sys.argv[1])
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
db.upgrade()
"""


def test_services_starting_together_migrate_one_at_a_time(tmp_path: Path) -> None:
    """The compose stack starts the API and its workers at once, each migrating the same new
    PostgreSQL database on start: one migrates, the others wait and find it done (they
    raced into CREATE TABLE alembic_version and crashed, seen with bench/bench_compose.py)."""
    import subprocess
    import sys

    from tests.relay_fixtures import fresh_postgres_database

    go = tmp_path / "go"
    with fresh_postgres_database() as url:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", UPGRADER, url, str(go)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        time.sleep(3)  # every process imported and waits for the same moment
        go.touch()
        errors = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
        assert [code for code, _ in errors] == [0, 0, 0, 0], errors
        db = Database(url)
        with db.session() as s:
            assert s.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
        db.engine.dispose()
