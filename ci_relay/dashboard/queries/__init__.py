"""The dashboard's reads: a fixed number of aggregated SQL queries per page, never one per row.

Every function takes a session and returns a view from :mod:`ci_relay.dashboard.views`
(or ``None`` when the thing asked for does not exist); the HTML pages and the JSON
API both call these, so they stay in step. Only the columns a page shows are
selected, which also keeps these reads working while other columns are added.

The reads are split per page (``grid``, ``runs`` for the commit, pull request and run pages,
``history`` for a test, ``trends``, ``health`` for L3 readiness, ``upgrades`` for a release
upgrade's comparison), with what they share in ``common``.
"""

from ci_relay.dashboard.queries.grid import grid
from ci_relay.dashboard.queries.health import health
from ci_relay.dashboard.queries.health_runs import health_runs
from ci_relay.dashboard.queries.history import history
from ci_relay.dashboard.queries.runs import commit_page, pull_request_page, result_details, run_page
from ci_relay.dashboard.queries.trends import trends
from ci_relay.dashboard.queries.upgrades import upgrade_page, upgrade_patch

__all__ = [
    "commit_page",
    "grid",
    "health",
    "health_runs",
    "history",
    "pull_request_page",
    "result_details",
    "run_page",
    "trends",
    "upgrade_page",
    "upgrade_patch",
]
