"""Engines and sessions for SQLite (embedded, WAL) and PostgreSQL (production)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
log = logging.getLogger("ci_relay.store")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine with the settings each backend needs for concurrent writers."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


# any constant: the PostgreSQL advisory lock that serializes migrations ("cirelay" in ASCII)
MIGRATION_LOCK = 0x6369_7265_6C61_79


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest migration (safe to run on every start). Services that
    start together (API and workers of a compose stack) each call this: on PostgreSQL they
    take one advisory lock for the migration's transaction, so one migrates and the others,
    waiting, then find the schema at head. SQLite's own write lock serializes them there."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def ping(engine: Engine) -> None:
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))


class Database:
    """An engine plus a session factory; ``session()`` commits or rolls back."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def upgrade(self) -> None:
        upgrade(self.engine)

    def defer_checkpoints(self, every: float = 1.0) -> threading.Event | None:
        """SQLite: this engine's commits stop checkpointing the WAL themselves, a background
        thread does it every ``every`` seconds; set the event to stop it (one last pass).

        By default the commit that grows the WAL past 1,000 pages copies it into the
        database and syncs: a webhook answered in 3 ms then takes 100 ms. The API calls
        this so that cost leaves the request path (PostgreSQL: nothing to do, None)."""
        if self.engine.dialect.name != "sqlite":
            return None

        def no_auto_checkpoint(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.execute("PRAGMA wal_autocheckpoint=0")

        event.listen(self.engine, "connect", no_auto_checkpoint)
        self.engine.dispose()  # pooled connections were opened with the default
        stop = threading.Event()

        def checkpoint() -> None:
            with self.engine.connect() as connection:
                connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

        def loop() -> None:
            while not stop.wait(every):
                try:
                    checkpoint()
                except Exception:  # a busy or closed database: the next pass tries again
                    log.debug("WAL checkpoint skipped", exc_info=True)
            try:
                checkpoint()
            except Exception:
                log.debug("last WAL checkpoint skipped", exc_info=True)

        threading.Thread(target=loop, name="ci-relay-wal-checkpoint", daemon=True).start()
        return stop

    def dispose(self) -> None:
        self.engine.dispose()
