"""The dashboard's HTTP surface: each page at ``/...`` and its JSON twin at ``/api/...``.

Both call the same query function; routes only parse parameters, open a session,
and render. Handlers are plain functions, so FastAPI runs the (blocking) database
reads in its thread pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi import Path as Path_
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment
from sqlalchemy.orm import Session

from ci_relay.api_docs import (
    HTML_NOT_FOUND,
    JSON_ANY,
    NOT_FOUND,
    PRINTABLE,
    BackendQuery,
    CommitPrefix,
    DbId,
    FailuresCursorQuery,
    RepositoryQuery,
)
from ci_relay.context import RelayContext
from ci_relay.dashboard import downstream, queries
from ci_relay.dashboard.figures import duration_chart, trend_charts
from ci_relay.dashboard.templating import make_environment
from ci_relay.dashboard.views import FailureCursor, to_json
from reuse_specs.backend_schema import NAME_PATTERN

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_PATH = "/static/dashboard"
PER_PAGE = 50
MAX_PER_PAGE = 200
PLAN_PER_PAGE = 100

T = TypeVar("T")


@dataclass(frozen=True)
class Dashboard:
    """What the pages share: the relay's context (its database) and the template environment;
    kept on ``app.state.dashboard`` by :func:`install`."""

    rt: RelayContext
    env: Environment


def install(app: FastAPI, rt: RelayContext) -> None:
    """Add the dashboard's pages, JSON API and stylesheet to the relay's app."""
    app.state.dashboard = Dashboard(rt, make_environment())
    app.include_router(router)
    app.mount(STATIC_PATH, StaticFiles(directory=STATIC_DIR), name="dashboard-static")


router = APIRouter()


def read(request: Request, query: Callable[[Session], T]) -> T:
    """One query in its own session (the twin routes of a page call the same one)."""
    dashboard: Dashboard = request.app.state.dashboard
    with dashboard.rt.db.session() as session:
        return query(session)


def page(
    request: Request, template: str, title: str, status: int = 200, **context: Any
) -> HTMLResponse:
    dashboard: Dashboard = request.app.state.dashboard
    html = dashboard.env.get_template(template).render(title=title, static=STATIC_PATH, **context)
    return HTMLResponse(html, status_code=status)


def missing(request: Request, message: str) -> HTMLResponse:
    return page(request, "not_found.html", "Not found", 404, message=message)


def found(view: Any, message: str) -> JSONResponse:
    """A view's JSON twin: the data the page shows, or 404 saying what was not found."""
    if view is None:
        raise HTTPException(404, message)
    return JSONResponse(to_json(view))


# browsers ask for it on pages that cannot name one (the plain-text failure texts)
@router.get("/favicon.ico", include_in_schema=False)
def favicon(request: Request) -> Response:
    return Response(status_code=204)


# grid -------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
def grid_page(
    request: Request,
    page_no: int = Query(1, ge=1, alias="page"),
    per_page: int = Query(PER_PAGE, ge=1, le=MAX_PER_PAGE),
) -> HTMLResponse:
    view = read(request, lambda s: queries.grid(s, page_no, per_page))
    return page(request, "grid.html", "Grid", grid=view)


@router.get("/api/grid", response_class=JSONResponse, responses=JSON_ANY)
def grid_api(
    request: Request,
    page_no: int = Query(1, ge=1, alias="page"),
    per_page: int = Query(PER_PAGE, ge=1, le=MAX_PER_PAGE),
) -> JSONResponse:
    return JSONResponse(to_json(read(request, lambda s: queries.grid(s, page_no, per_page))))


# commit and pull request --------------------------------------------------------------


@router.get("/commits/{sha}", response_class=HTMLResponse, responses=HTML_NOT_FOUND)
def commit_html(request: Request, sha: CommitPrefix) -> HTMLResponse:
    view = read(request, lambda s: queries.commit_page(s, sha))
    if view is None:
        return missing(request, f"No change for commit {sha} has been received.")
    return page(request, "commit.html", f"Commit {sha[:10]}", view=view)


@router.get("/api/commits/{sha}", response_class=JSONResponse, responses={**JSON_ANY, **NOT_FOUND})
def commit_api(request: Request, sha: CommitPrefix) -> JSONResponse:
    view = read(request, lambda s: queries.commit_page(s, sha))
    return found(view, f"no change for commit {sha} has been received")


@router.get("/prs/{number}", response_class=HTMLResponse, responses=HTML_NOT_FOUND)
def pull_request_html(request: Request, number: DbId, repo: RepositoryQuery = None) -> HTMLResponse:
    view = read(request, lambda s: queries.pull_request_page(s, number, repo))
    if view is None:
        where = f" in {repo}" if repo else ""
        return missing(request, f"No change for pull request #{number}{where} has been received.")
    return page(request, "pull_request.html", f"PR #{number}", view=view)


@router.get("/api/prs/{number}", response_class=JSONResponse, responses={**JSON_ANY, **NOT_FOUND})
def pull_request_api(request: Request, number: DbId, repo: RepositoryQuery = None) -> JSONResponse:
    view = read(request, lambda s: queries.pull_request_page(s, number, repo))
    return found(view, f"no change for pull request #{number} has been received")


# run ------------------------------------------------------------------------------------


@router.get("/runs/{run_id}", response_class=HTMLResponse, responses=HTML_NOT_FOUND)
def run_html(
    request: Request,
    run_id: DbId,
    selected_page: int = Query(1, ge=1),
    excluded_page: int = Query(1, ge=1),
    failures_after: FailuresCursorQuery = None,
) -> HTMLResponse:
    after = FailureCursor.parse(failures_after) if failures_after else None
    view = read(
        request,
        lambda s: queries.run_page(
            s, run_id, selected_page, excluded_page, PLAN_PER_PAGE, failures_after=after
        ),
    )
    if view is None:
        return missing(request, f"There is no run {run_id}.")
    return page(request, "run.html", f"Run {run_id}", view=view)


# ``/api/runs/{id}`` is the relay's raw run (every result, the whole plan); this is the
# run page's data: failures (``failures_next`` is the cursor of the next page), shards
# and the selection explained, paginated
@router.get(
    "/api/runs/{run_id}/view", response_class=JSONResponse, responses={**JSON_ANY, **NOT_FOUND}
)
def run_api(
    request: Request,
    run_id: DbId,
    selected_page: int = Query(1, ge=1),
    excluded_page: int = Query(1, ge=1),
    failures_after: FailuresCursorQuery = None,
) -> JSONResponse:
    after = FailureCursor.parse(failures_after) if failures_after else None
    view = read(
        request,
        lambda s: queries.run_page(
            s, run_id, selected_page, excluded_page, PLAN_PER_PAGE, failures_after=after
        ),
    )
    return found(view, f"no run {run_id}")


# the whole text of one failure (pages show long ones cut); plain text, never sniffed
# as HTML: it comes from upstream code
@router.get(
    "/api/results/{result_id}/details", response_class=PlainTextResponse, responses=NOT_FOUND
)
def result_details(request: Request, result_id: DbId) -> PlainTextResponse:
    text = read(request, lambda s: queries.result_details(s, result_id))
    if text is None:
        raise HTTPException(404, f"no failure text stored for result {result_id}")
    return PlainTextResponse(text, headers={"x-content-type-options": "nosniff"})


# another relay's posted result -------------------------------------------------------------


@router.get("/downstream/{result_id}", response_class=HTMLResponse, responses=HTML_NOT_FOUND)
def downstream_html(request: Request, result_id: DbId) -> HTMLResponse:
    view = read(request, lambda s: downstream.record(s, result_id))
    if view is None:
        return missing(request, f"No result {result_id} has been posted by another relay.")
    return page(request, "downstream.html", f"{view.cell.column}", view=view)


@router.get(
    "/api/downstream/{result_id}",
    response_class=JSONResponse,
    responses={**JSON_ANY, **NOT_FOUND},
)
def downstream_api(request: Request, result_id: DbId) -> JSONResponse:
    view = read(request, lambda s: downstream.record(s, result_id))
    return found(view, f"no result {result_id} has been posted by another relay")


# release upgrade ---------------------------------------------------------------------------


@router.get("/upgrades/{upgrade_id}", response_class=HTMLResponse, responses=HTML_NOT_FOUND)
def upgrade_html(request: Request, upgrade_id: DbId) -> HTMLResponse:
    view = read(request, lambda s: queries.upgrade_page(s, upgrade_id))
    if view is None:
        return missing(request, f"No upgrade job {upgrade_id} has been submitted.")
    return page(request, "upgrade.html", f"Upgrade {upgrade_id}", view=view)


@router.get(
    "/api/upgrades/{upgrade_id}",
    response_class=JSONResponse,
    responses={**JSON_ANY, **NOT_FOUND},
)
def upgrade_api(request: Request, upgrade_id: DbId) -> JSONResponse:
    view = read(request, lambda s: queries.upgrade_page(s, upgrade_id))
    return found(view, f"no upgrade job {upgrade_id}")


@router.get("/upgrades/{upgrade_id}/patch", response_class=PlainTextResponse, responses=NOT_FOUND)
def upgrade_patch(request: Request, upgrade_id: DbId) -> PlainTextResponse:
    text = read(request, lambda s: queries.upgrade_patch(s, upgrade_id))
    if text is None:
        raise HTTPException(404, f"no upgrade job {upgrade_id}")
    return PlainTextResponse(
        text, media_type="text/x-diff", headers={"x-content-type-options": "nosniff"}
    )


# test -------------------------------------------------------------------------------------


@router.get("/tests", response_class=HTMLResponse, responses=HTML_NOT_FOUND)
def test_html(
    request: Request,
    nodeid: str = Query(..., min_length=1, max_length=1024, pattern=PRINTABLE),
    page_no: int = Query(1, ge=1, alias="page"),
) -> HTMLResponse:
    view = read(request, lambda s: queries.history(s, nodeid, page_no, PER_PAGE))
    if view is None:
        return missing(request, f"No result has been stored for the test {nodeid}.")
    return page(request, "test.html", "Test history", view=view, chart=duration_chart(view))


@router.get("/api/tests", response_class=JSONResponse, responses={**JSON_ANY, **NOT_FOUND})
def test_api(
    request: Request,
    nodeid: str = Query(..., min_length=1, max_length=1024, pattern=PRINTABLE),
    page_no: int = Query(1, ge=1, alias="page"),
) -> JSONResponse:
    view = read(request, lambda s: queries.history(s, nodeid, page_no, PER_PAGE))
    return found(view, f"no result has been stored for the test {nodeid}")


# trends ------------------------------------------------------------------------------------


@router.get("/trends", response_class=HTMLResponse)
def trends_html(
    request: Request, backend: BackendQuery = None, limit: int = Query(200, ge=1, le=2000)
) -> HTMLResponse:
    view = read(request, lambda s: queries.trends(s, backend or None, limit))
    return page(request, "trends.html", "Trends", view=view, charts=trend_charts(view), limit=limit)


@router.get("/api/trends", response_class=JSONResponse, responses=JSON_ANY)
def trends_api(
    request: Request, backend: BackendQuery = None, limit: int = Query(200, ge=1, le=2000)
) -> JSONResponse:
    return JSONResponse(to_json(read(request, lambda s: queries.trends(s, backend or None, limit))))


# L3 readiness -----------------------------------------------------------------------------


def _health_window(request: Request, days: int | None) -> int:
    """The readiness window asked for, else the relay's (``CI_RELAY_HEALTH_WINDOW_DAYS``)."""
    return days or int(request.app.state.dashboard.rt.settings.health_window_days)


@router.get("/health", response_class=HTMLResponse)
def health_html(request: Request, days: int | None = Query(None, ge=1, le=365)) -> HTMLResponse:
    window = _health_window(request, days)
    view = read(request, lambda s: queries.health(s, window))
    return page(request, "health.html", "L3 readiness", view=view)


@router.get("/api/health", response_class=JSONResponse, responses=JSON_ANY)
def health_api(request: Request, days: int | None = Query(None, ge=1, le=365)) -> JSONResponse:
    window = _health_window(request, days)
    return JSONResponse(to_json(read(request, lambda s: queries.health(s, window))))


HealthFigureQuery = Annotated[
    str,
    Query(
        pattern=r"^(|pass_rate|timeout_rate|overrun_rate|end_to_end_p50|queue_time_avg)$",
        description="the figure whose runs to list ('': only the unfinished and overdue runs)",
    ),
]
BackendPath = Annotated[str, Path_(max_length=32, pattern=NAME_PATTERN)]


@router.get("/health/{backend}", response_class=HTMLResponse)
def health_runs_html(
    request: Request,
    backend: BackendPath,
    figure: HealthFigureQuery = "",
    days: int | None = Query(None, ge=1, le=365),
) -> HTMLResponse:
    window = _health_window(request, days)
    view = read(request, lambda s: queries.health_runs(s, backend, window, figure))
    return page(request, "health_runs.html", f"L3 readiness · {backend}", view=view)


@router.get("/api/health/{backend}", response_class=JSONResponse, responses=JSON_ANY)
def health_runs_api(
    request: Request,
    backend: BackendPath,
    figure: HealthFigureQuery = "",
    days: int | None = Query(None, ge=1, le=365),
) -> JSONResponse:
    window = _health_window(request, days)
    return JSONResponse(
        to_json(read(request, lambda s: queries.health_runs(s, backend, window, figure)))
    )
