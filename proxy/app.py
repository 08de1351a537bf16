"""The FastAPI application: `create_app(cfg)` and the state its lifespan owns.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from proxy.config import Config
from proxy.engines.backends import make_engine
from proxy.engines.base import Engine, EngineUnavailable
from proxy.errors import APIError, engine_unavailable
from proxy.metrics import Metrics
from proxy.routes.common import anthropic_error, error_response, is_messages_route
from proxy.runtime.model_files import served_name
from proxy.schemas.common import validation_error
from proxy.sessions import SessionService, expire_open_sessions
from proxy.store.db import Database

if TYPE_CHECKING:
    from proxy.admission import Admission
    from proxy.completions import CompletionService
    from proxy.render import Renderer
    from proxy.rewards_service import RewardService

log = logging.getLogger("areal_proxy")


@dataclass
class AppState:
    """Everything the routes share, built by `create_app` and completed by the lifespan; routes get
    its parts through `proxy/routes/deps.py`."""

    cfg: Config
    metrics: Metrics
    db: Database
    sessions: SessionService
    engine: Engine
    served_name: str
    started_at: float = field(default_factory=time.time)
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # loop-agnostic since Python 3.10
    load_error: BaseException | None = None
    waiting_for: str = ""  # what a remote engine start is waiting for
    renderer: Renderer | None = None
    completions: CompletionService | None = None
    rewards: RewardService | None = None
    admission: Admission | None = None

    @classmethod
    def build(cls, cfg: Config) -> AppState:
        db = Database(cfg.store, owner=True)
        return cls(
            cfg=cfg,
            metrics=Metrics(),
            db=db,
            sessions=SessionService(db, cfg.proxy.admin_key, cfg.proxy.auto_sessions),
            engine=make_engine(cfg.engine),
            served_name=cfg.proxy.served_model_name or served_name(cfg.engine.model),
        )

    async def load_engine(self) -> None:
        from proxy.completions import CompletionService
        from proxy.render import Renderer

        try:
            await self._start_engine()
            tokenizer = getattr(self.engine, "tokenizer", None)
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.engine.info.model_path)
            self.renderer = Renderer(tokenizer, self.engine.info.eos_token_ids)
            self.completions = CompletionService(
                self.engine, self.renderer, self.db, self.sessions, self.cfg.proxy.default_max_tokens
            )
            self.ready.set()
            log.info("engine ready: %s (version %d)", self.served_name, self.engine.version)
        except Exception as exc:  # reported by /health and on every model call
            self.load_error = exc
            log.exception("engine failed to start")

    async def _start_engine(self) -> None:
        """Start the engine; remote engine servers that are not up yet are waited for."""
        delay = 1.0
        while True:
            try:
                await self.engine.start()
                return
            except EngineUnavailable as exc:
                if self.cfg.engine.backend == "local":
                    raise
                self.waiting_for = str(exc)
                log.warning("engine servers not ready (%s); retrying in %.0fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 15.0)

    def require_ready(self) -> None:
        if self.load_error is not None:
            raise engine_unavailable(f"the engine failed to start: {self.load_error}", retry_after=30)
        if not self.ready.is_set():
            detail = f": {self.waiting_for}" if self.waiting_for else ""
            raise engine_unavailable(f"the engine is still loading{detail}", retry_after=2)

    def observe_call(self, api: str, started: float, results: list) -> None:
        self.metrics.inc("areal_requests_total", api=api)
        self.metrics.inc("areal_completions_total", len(results), api=api)
        self.metrics.inc("areal_generated_tokens_total", sum(len(r.generation.output_ids) for r in results))
        self.metrics.observe("areal_request_seconds", time.perf_counter() - started, api=api)


async def _sweep_sessions(state: AppState) -> None:
    """Close sessions idle past `[proxy] session_timeout_s` as failed."""
    timeout = state.cfg.proxy.session_timeout_s
    while True:
        await asyncio.sleep(min(30.0, max(1.0, timeout / 4)))
        try:
            expired = await state.db.write(lambda c: expire_open_sessions(c, timeout, time.time()))
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
        if cfg.proxy.admission:
            from proxy.admission import Admission

            state.admission = Admission(state.db, cfg.trainer.max_staleness, cfg.trainer.batch.size)
        loader = asyncio.create_task(state.load_engine())
        sweeper = asyncio.create_task(_sweep_sessions(state))
        try:
            yield
        finally:
            sweeper.cancel()
            loader.cancel()
            with contextlib.suppress(Exception):
                await state.engine.stop()
            state.db.close()

    app = FastAPI(title="areal-proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    _install_handlers(app)
    from proxy.routes import chat, control

    app.include_router(chat.router)
    app.include_router(control.router)
    for module in _optional_routers():
        app.include_router(module.router)
    app.add_middleware(BodyLimit, limit=cfg.proxy.max_request_bytes)
    return app


def _optional_routers() -> list[Any]:
    import importlib

    modules = []
    for name in ("proxy.routes.responses", "proxy.routes.messages"):
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return modules


def _install_handlers(app: FastAPI) -> None:
    def answer(request: Request, error: APIError) -> Response:
        return anthropic_error(error) if is_messages_route(request.url.path) else error_response(error)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):  # noqa: ANN202
        return answer(request, exc)

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
