"""What an HTTP answer means for an outbox message: sent, retry later, or stop.

The rule of the design: a 4xx (except 408 and 429) means our payload is wrong, so the
message stops as ``failed`` with the answer in ``last_error``; a 5xx, 408, 429 or a
network error means retry, at the time ``Retry-After`` asks for when it says one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

RETRYABLE_4XX = frozenset({408, 429})
MAX_ERROR_BODY = 2000
MAX_RETRY_AFTER = timedelta(days=1)  # a longer wish is taken as a day


class RetryLater(Exception):
    """The target could not take it now; try again at ``until`` (else after backoff)."""

    def __init__(self, reason: str, until: datetime | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.until = until


class Rejected(Exception):
    """The target refused the report itself: sending it again would not help."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass
class SendContext:
    """What a target's send step gets: a client, the clock, and what earlier attempts saved."""

    client: httpx.Client
    now: datetime
    earlier: dict[str, Any] = field(default_factory=dict)  # results of this run's sent reports
    own: dict[str, Any] = field(default_factory=dict)  # progress this message saved before
    save: Callable[[dict[str, Any]], None] = lambda _progress: None


Send = Callable[[SendContext], dict[str, Any]]


def retry_after(value: str | None, now: datetime) -> datetime | None:
    """``Retry-After`` as a time: delta-seconds or an HTTP date; None when absent or garbled."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        delay = timedelta(seconds=int(value))
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        delay = when - now
    return now + min(max(delay, timedelta(0)), MAX_RETRY_AFTER)


def describe(response: httpx.Response) -> str:
    """The answer as ``last_error`` shows it: status, where, and the start of the body."""
    request = response.request
    url = request.url.copy_with(query=None)
    text = response.text
    if len(text) > MAX_ERROR_BODY:
        text = text[:MAX_ERROR_BODY] + f"... ({len(response.content)} bytes)"
    return f"HTTP {response.status_code} from {request.method} {url}: {text}"


def check(response: httpx.Response, now: datetime) -> None:
    """Raise unless the answer is a success."""
    status = response.status_code
    if 200 <= status < 300:
        return
    if status >= 500 or status in RETRYABLE_4XX:
        raise RetryLater(describe(response), retry_after(response.headers.get("retry-after"), now))
    raise Rejected(describe(response), status)


def request(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    content: bytes | None = None,
    json: Any = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """One HTTP call; a network failure (refused, reset, timeout) becomes ``RetryLater``."""
    try:
        return client.request(method, url, content=content, json=json, headers=headers)
    except httpx.TransportError as exc:
        where = httpx.URL(url).copy_with(query=None)
        raise RetryLater(f"{type(exc).__name__} on {method} {where}: {exc}") from exc
