"""The Jinja2 environment: templates shipped in the package, autoescaping always on.

Test names, failure messages and logs come from upstream code and may contain
markup (``test_<script>``); autoescape for every template, not only ``*.html``,
means no page can forget it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined

# how a count reads in a grid cell or a run's summary line
COUNT_LABELS = {
    "passed": "pass",
    "failed": "fail",
    "error": "err",
    "crashed": "crash",
    "xpass_strict": "xpass!",
    "flaky": "flaky",
    "xfailed": "xfail",
    "xpassed": "xpass",
    "skipped": "skip",
}


def short_sha(sha: str | None, length: int = 10) -> str:
    return (sha or "")[:length]


def when(value: datetime | None) -> str:
    """A timestamp as UTC minutes (SQLite returns naive UTC, PostgreSQL aware)."""
    if value is None:
        return "—"
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M UTC")


def when_s(value: datetime | None) -> str:
    """A timestamp to the second (a retry's next attempt is often seconds away)."""
    if value is None:
        return "—"
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def score(value: float, signed: bool = False) -> str:
    """A selection score: two decimals, or three significant digits when that shows nothing
    (the backtest ranking scores in chances, often below 0.01)."""
    sign = "+" if signed else ""
    if value == 0 or abs(value) >= 0.01:
        return f"{value:{sign}.2f}"
    return f"{value:{sign}.2g}"


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value == 0:
        return "0 s"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def with_params(path: str, **params: Any) -> str:
    """A link to ``path`` with query parameters (``None`` values dropped), encoded."""
    kept = {k: v for k, v in params.items() if v is not None}
    return f"{path}?{urlencode(kept)}" if kept else path


def page_link(path: str, params: dict[str, Any], key: str, number: int) -> str:
    """A pager link: the page's other parameters kept, one page number replaced."""
    return with_params(path, **{**params, key: number})


def make_environment() -> Environment:
    env = Environment(
        loader=PackageLoader("ci_relay.dashboard", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        short=short_sha, when=when, when_s=when_s, seconds=seconds, percent=percent, score=score
    )
    env.globals.update(with_params=with_params, page_link=page_link, COUNT_LABELS=COUNT_LABELS)
    return env
