"""`areal-proxy ui`: the web UI alone, over any store, without an engine.

For a finished run, a store copied off a cluster, or a live run's PostgreSQL store read from
another machine. It only reads (opening the store still brings its schema up to date, as every
process that opens one does), takes no SQLite ownership lock, so it runs beside the proxy that
writes the store, and answers `/health` like our other servers. Off loopback it needs an admin
key, as they do.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI
from starlette.responses import RedirectResponse, Response

from proxy.config import Config
from proxy.routes.common import json_response
from proxy.store.db import Database

log = logging.getLogger("areal_proxy")


def create_ui_app(cfg: Config, run_dir: Path) -> FastAPI:
    """The UI's routes on their own app, over `cfg.store`; the store opens (and migrates) now."""
    from proxy.app import install_error_handlers
    from proxy.ui.routes import router
    from proxy.ui.state import UIState

    db = Database(cfg.store)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            db.close()

    app = FastAPI(title="areal-proxy ui", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ui = UIState(cfg, db, run_dir, cfg.proxy.admin_key)
    install_error_handlers(app)
    app.include_router(router)

    @app.get("/health", include_in_schema=False)
    async def health() -> Response:
        return json_response({"status": "ok"})

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse("ui/")

    return app


def serve_ui(cfg: Config, host: str, port: int, run_dir: Path) -> int:
    from proxy.servers.http import run_uvicorn

    app = create_ui_app(cfg, run_dir)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/ui"
    print(f"areal-proxy ui: {url} (store {cfg.store.url.split('@')[-1]}, run {run_dir})", file=sys.stderr)
    return run_uvicorn(app, host, port, cfg.proxy.log_level, admin_key=cfg.proxy.admin_key, what="the UI")
