"""The FastAPI application: `create_app(cfg)`, its lifespan, error handlers and body limit.

The lifespan opens the store (migrating it), then loads the engine in the
background: the port answers at once, `GET /health` says 503 "loading" until the
model is ready, and model calls get 503 + Retry-After meanwhile. Errors of every
kind leave as OpenAI-shaped bodies; an unexpected one is logged with its
traceback and answered as a plain 500 without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from proxy.config import Config
from proxy.errors import APIError, store_unavailable
from proxy.routes.common import anthropic_error, error_response, is_messages_route
from proxy.routes.deps import ModelCallTable
from proxy.schemas.common import validation_error
from proxy.sessions import expire_open_sessions
from proxy.state import AppState
from proxy.store.db import StoreUnavailable

log = logging.getLogger("areal_proxy")


async def _sweep_sessions(state: AppState) -> None:
    """Close sessions idle past `[proxy] session_timeout_s` as failed (online, automatic episodes are
    the online sweeper's to end)."""
    timeout = state.cfg.proxy.session_timeout_s
    named_only = state.cfg.online.enabled
    while True:
        await asyncio.sleep(min(30.0, max(1.0, timeout / 4)))
        busy = list(state.completions.calls_in_flight) if state.completions is not None else []

        def sweep(conn: Any, busy: list[str] = busy) -> list[str]:
            return expire_open_sessions(conn, timeout, time.time(), named_only=named_only, busy=busy)

        try:
            expired = await state.db.write(sweep)
        except StoreUnavailable as exc:  # the store is out: one line a round, not a traceback
            log.warning("session sweep skipped: %s", exc)
            continue
        except Exception:  # the sweeper retries next round; serving goes on
            log.exception("session sweep failed")
            continue
        for session_id in expired:
            state.sessions.set_status(session_id, "failed")
        if expired:
            state.metrics.inc("areal_sessions_timed_out_total", len(expired))


def create_app(cfg: Config) -> FastAPI:
    """Build the app; opens (and migrates) the store now, so a locked store fails here."""
    state = AppState.build(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.areal = state
        state.db.start_writer()
        from proxy.rewards_service import RewardService

        state.rewards = RewardService(state.db, state.sessions, cfg.rewards, state.metrics)
        from proxy.online import OnlineEpisodes

        state.online = OnlineEpisodes(state.db, state.sessions, state.rewards, cfg.online, state.metrics)
        online = asyncio.create_task(state.online.run()) if cfg.online.enabled else None
        if cfg.proxy.admission:
            from proxy.admission import Admission

            state.admission = Admission(state.db, cfg.trainer.max_staleness, cfg.trainer.batch.size)
        loader = asyncio.create_task(state.load_engine())
        sweeper = asyncio.create_task(_sweep_sessions(state))
        try:
            yield
        finally:
            sweeper.cancel()
            if online is not None:
                online.cancel()
            loader.cancel()
            with contextlib.suppress(Exception):
                await state.engine.stop()
            state.db.close()

    app = ProxyApp(title="areal-proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    from proxy.routes import chat, control

    app.include_router(chat.router)
    app.include_router(control.router)
    _mount_ui(app, state)
    routers = [chat.router, *(module.router for module in _optional_routers())]
    for router in routers[1:]:
        app.include_router(router)
    table = ModelCallTable(route for router in routers for route in router.routes)
    app.router.routes.insert(0, table)
    app.add_middleware(BodyLimit, limit=cfg.proxy.max_request_bytes)
    app.open_lane(table, cfg.proxy.max_request_bytes)
    return app


class ProxyApp(FastAPI):
    """The proxy's FastAPI app, with a lane past FastAPI for the model calls.

    A POST the model-call table matches goes straight to its route, under the same body limit and
    the same exception handlers (an unexpected error answered by the handler of `Exception`, as
    Starlette's outermost middleware does). FastAPI's own way there (its OpenTelemetry check, six
    middlewares, its route table, a wrapper around every message sent) took ~16% of the proxy's CPU a
    call. Everything else, and every model call while no lane is open, goes through FastAPI."""

    _table: ModelCallTable | None = None

    def open_lane(self, table: ModelCallTable, limit: int) -> None:
        """Open the lane to `table`'s routes, once the exception handlers are installed."""
        handlers: dict[Any, Any] = {}
        statuses: dict[int, Any] = {}
        for key, handler in self.exception_handlers.items():
            if key not in (500, Exception):
                (statuses if isinstance(key, int) else handlers)[key] = handler
        self._handlers = (handlers, statuses)
        self._unexpected = self.exception_handlers.get(Exception)
        self._lane = BodyLimit(self._model_call, limit)
        self._table = table

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        table = self._table
        if table is not None and scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            route, params = table.find(scope["path"])
            if route is not None:
                scope["app"] = self
                scope["router"] = self.router
                scope["path_params"] = params
                scope["endpoint"] = route.endpoint
                scope["route"] = route
                scope["starlette.exception_handlers"] = self._handlers
                await self._lane(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _model_call(self, scope: Any, receive: Any, send: Any) -> None:
        started = False

        async def sending(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await scope["route"].app(scope, receive, sending)
        except Exception as exc:
            if started or self._unexpected is None:
                raise  # the answer is under way: the server closes the connection
            response = await self._unexpected(Request(scope), exc)
            await response(scope, receive, send)


def _mount_ui(app: FastAPI, state: AppState) -> None:
    """The web UI at /ui over this proxy's store, decoding tokens with its engine's tokenizer."""
    from pathlib import Path

    from proxy.ui.routes import router
    from proxy.ui.state import UIState

    def tokenizer() -> Any:
        return state.renderer.tokenizer if state.renderer is not None else None

    run_dir = Path(state.cfg.trainer.run_dir).expanduser()
    app.state.ui = UIState(state.cfg, state.db, run_dir, state.cfg.proxy.admin_key, tokenizer=tokenizer)
    app.include_router(router)


def _optional_routers() -> list[Any]:
    import importlib

    modules = []
    for name in ("proxy.routes.responses", "proxy.routes.messages", "proxy.routes.legacy"):
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return modules


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves in its API's shape (OpenAI's; Anthropic's on the Messages routes)."""

    def answer(request: Request, error: APIError) -> Response:
        return anthropic_error(error) if is_messages_route(request.url.path) else error_response(error)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):  # noqa: ANN202
        return answer(request, exc)

    @app.exception_handler(StoreUnavailable)
    async def _store(request: Request, exc: StoreUnavailable):  # noqa: ANN202
        return answer(request, store_unavailable(str(exc)))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):  # noqa: ANN202
        return answer(request, validation_error(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):  # noqa: ANN202
        # FastAPI reports whatever broke reading the body as "error parsing the body": the cause says what.
        if isinstance(exc.__cause__, ClientDisconnect):
            return gone(request)
        if isinstance(exc.__cause__, APIError):  # the body limit, hit by a body sent without a length
            return answer(request, exc.__cause__)
        message = {404: "no such route", 405: "method not allowed"}.get(exc.status_code, str(exc.detail))
        code = "not_found" if exc.status_code == 404 else None
        return answer(request, APIError(exc.status_code, message, code=code))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, _: ClientDisconnect):  # noqa: ANN202
        return gone(request)

    def gone(request: Request) -> Response:
        # The caller hung up before its body arrived (an agent cancelled, a run stopped): nothing
        # was started or stored, and nobody is left to read an answer. 499 as nginx logs it.
        log.info("client disconnected before sending the whole body of %s %s", request.method, request.url.path)
        return error_response(APIError(499, "the client closed the request", code="client_closed_request"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):  # noqa: ANN202
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(APIError(500, "internal server error", type="server_error", code="internal_error"))


class BodyLimit:
    """Refuse request bodies over the limit with 413 before they are read in full, and read every
    body as JSON whatever content type the client named (`curl -d` says form-urlencoded): the
    routes take JSON only."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(send)
            return
        if scope["method"] in ("POST", "PUT", "PATCH") and b"json" not in headers.get(b"content-type", b""):
            kept = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*kept, (b"content-type", b"application/json")]}
        seen = 0

        async def limited_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise self._error()
            return message

        await self.app(scope, limited_receive, send)

    def _error(self) -> APIError:
        return APIError(413, f"request body exceeds the limit of {self.limit} bytes", code="request_too_large")

    async def _refuse(self, send: Any) -> None:
        exc = self._error()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": exc.json()})
