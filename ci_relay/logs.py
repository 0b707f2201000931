"""Structured (JSON lines) logging with the delivery id on every line it concerns.

The delivery id lives in a context variable: intake binds it per request, the
pipeline binds it per task, and a filter copies it onto every log record.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

_delivery: contextvars.ContextVar[str | None] = contextvars.ContextVar("delivery", default=None)


@contextmanager
def delivery_context(delivery_id: str | None) -> Iterator[None]:
    token = _delivery.set(delivery_id)
    try:
        yield
    finally:
        _delivery.reset(token)


class _DeliveryFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.delivery_id = _delivery.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "delivery_id": getattr(record, "delivery_id", None),
            "msg": record.getMessage(),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


def configure_logging(level: int = logging.INFO) -> None:
    """JSON lines on stderr for every logger, each carrying the current delivery id."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_DeliveryFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
