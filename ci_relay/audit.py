"""The audit trail of rejected requests, bounded so that a flood cannot fill the disk.

Anyone on the network can send a bad signature, a wrong token or garbage. Each rejection
must leave evidence, but not a database write per request: the first rejection of a kind
(path, status, reason, remote address) in a window is written at once, later ones of the
same kind in that window are only counted in memory and added to that row's ``count``
when the window closes (or at :meth:`AuditLog.flush`, which the app calls on shutdown).
A flood of N identical bad requests costs one insert and one update per window.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import update

from ci_relay.store.database import Database
from ci_relay.store.models import AuditRecord, utcnow

log = logging.getLogger("ci_relay.audit")

MAX_REASON = 500  # of the stored reason text; a rejected body never reaches this table
MAX_KIND = 120  # of the reason's grouping key
# the columns' widths (every value here may be attacker-chosen)
MAX_PATH, MAX_REMOTE, MAX_EVENT, MAX_DELIVERY = 128, 128, 64, 128


@dataclass
class _Window:
    opened: float
    row_id: int | None = None
    pending: int = 0  # rejections counted since the row was written or last updated


def _kind(reason: str) -> str:
    """What a reason says without its details (JSON error positions, names): the grouping key."""
    return reason.split(":", 1)[0][:MAX_KIND]


def _clip(value: str | None, limit: int) -> str | None:
    return None if value is None else value[:limit]


class AuditLog:
    """Rejections, one row per kind per window; thread-safe (intake runs in a thread pool)."""

    def __init__(
        self,
        db: Database,
        window_seconds: float = 60.0,
        max_kinds: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.clock = clock
        self.window_seconds = window_seconds
        self.max_kinds = max_kinds
        self._windows: dict[tuple[str, int, str, str | None], _Window] = {}
        self._lock = threading.Lock()

    def record(
        self,
        path: str,
        status: int,
        reason: str,
        remote: str | None,
        event: str | None = None,
        delivery_id: str | None = None,
    ) -> None:
        now = self.clock()
        key = (path[:MAX_PATH], status, _kind(reason), _clip(remote, MAX_REMOTE))
        closed: list[_Window] = []
        with self._lock:
            window = self._windows.get(key)
            if window is not None and now - window.opened < self.window_seconds:
                window.pending += 1
                return
            if window is not None:
                closed.append(self._windows.pop(key))
            if len(self._windows) >= self.max_kinds:  # too many kinds: close them all
                closed.extend(self._windows.values())
                self._windows.clear()
            window = self._windows[key] = _Window(opened=now)
        self._write_counts(closed)
        with self.db.session() as session:
            row = AuditRecord(
                path=key[0],
                status=status,
                reason=reason[:MAX_REASON],
                remote=key[3],
                event=_clip(event, MAX_EVENT),
                delivery_id=_clip(delivery_id, MAX_DELIVERY),
                count=1,
                last_at=utcnow(),
            )
            session.add(row)
            session.flush()
            row_id = row.id
        with self._lock:
            window.row_id = row_id

    def flush(self) -> None:
        """Write every pending count (the app calls this when it stops)."""
        with self._lock:
            windows = list(self._windows.values())
            self._windows.clear()
        self._write_counts(windows)

    def _write_counts(self, windows: list[_Window]) -> None:
        todo = [w for w in windows if w.pending and w.row_id is not None]
        if not todo:
            return
        try:
            with self.db.session() as session:
                for window in todo:
                    session.execute(
                        update(AuditRecord)
                        .where(AuditRecord.id == window.row_id)
                        .values(count=AuditRecord.count + window.pending, last_at=utcnow())
                    )
        except Exception:  # counts are evidence, not state: never fail a request over them
            log.exception("could not write %d audit count(s)", len(todo))
