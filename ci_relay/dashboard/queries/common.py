"""What the dashboard's reads share: limits, pagination, titles and counting helpers."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    case,
    func,
)

from ci_relay.dashboard.paging import Pager
from ci_relay.store.models import (
    OutboxState,
)

# failures a page shows per run; the run page pages through the rest (a cursor), so a run
# with thousands of failures stays a page of bounded size
FAILURES_PER_RUN = 50
TITLE_BODY_LIMIT = 2 * 1024 * 1024  # larger bodies are not parsed just for a title
LOG_EXCERPT_LINES = 20
# characters of a failure's text a page shows (head and tail halves); the rest is a link away
DETAILS_SHOWN = 4 * 1024
_OPEN_REPORTS = (OutboxState.PENDING, OutboxState.SENDING)  # a next attempt is coming
_HEX = re.compile(r"^[0-9a-fA-F]{7,64}$")


def _clamp(page: int, per_page: int, total: int) -> Pager:
    pages = max(1, -(-total // per_page))
    return Pager(min(max(1, page), pages), per_page, total)


# --- grid -----------------------------------------------------------------------------


def _title(source: str, body: bytes) -> str | None:
    """A PR title or a pushed commit's first line, from the stored raw delivery."""
    if len(body) > TITLE_BODY_LIMIT:
        return None
    try:
        data: Any = json.loads(body)
        if source == "dispatch":
            data = data.get("client_payload", data).get("payload", {})
        pr = data.get("pull_request")
        if isinstance(pr, dict) and pr.get("title"):
            return str(pr["title"])
        commit = data.get("head_commit")
        if isinstance(commit, dict) and commit.get("message"):
            return str(commit["message"]).splitlines()[0]
    except (ValueError, AttributeError):
        pass
    return None


def _count_of(condition: ColumnElement[bool]) -> Any:
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


def _seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    if (start.tzinfo is None) != (end.tzinfo is None):  # SQLite hands back naive UTC
        start, end = start.replace(tzinfo=None), end.replace(tzinfo=None)
    return max(0.0, (end - start).total_seconds())
