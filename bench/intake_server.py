"""Server side of bench_intake.py: the relay app, or a bare 202 endpoint, under uvicorn."""

from __future__ import annotations

import argparse
import os

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def bare_app() -> FastAPI:
    app = FastAPI()

    @app.post("/webhooks/github")
    async def accept(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"ok": True}, status_code=202)

    @app.get("/healthz")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def relay_app() -> FastAPI:
    from ci_relay.settings import Settings

    try:
        from ci_relay.service.app import create_app
        from ci_relay.service.publisher import BackgroundPublisher
        from ci_relay.service.tasks import configure, enqueue
    except ImportError:  # --previous REV from before the service package (issue 12)
        from ci_relay.app import create_app  # type: ignore[no-redef]
        from ci_relay.publisher import BackgroundPublisher  # type: ignore[no-redef]
        from ci_relay.tasks import configure, enqueue  # type: ignore[no-redef]

    rt = configure(Settings())
    rt.db.upgrade()
    if os.environ.get("BENCH_NO_PUBLISH"):  # diagnosis: the request path without the queue
        return create_app(rt, lambda _steps: None)
    return create_app(rt, BackgroundPublisher(enqueue).submit)  # as `ci-relay serve` does


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["bare", "relay"])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = bare_app() if args.mode == "bare" else relay_app()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
