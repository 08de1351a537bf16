"""The state a running proxy shares between its routes: the store, the engine and the services.

Built by `proxy.app.create_app` and completed by its lifespan (the engine loads in the
background, then the renderer and the completion service are made); routes get its parts
through `proxy/routes/deps.py`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.config import Config
from proxy.engines.backends import make_engine
from proxy.engines.base import Engine, EngineUnavailable
from proxy.errors import engine_unavailable
from proxy.metrics import Metrics
from proxy.runtime.model_files import served_name
from proxy.sessions import SessionService
from proxy.store.db import Database

if TYPE_CHECKING:
    from proxy.admission import Admission
    from proxy.completions import CompletionService
    from proxy.online import OnlineEpisodes
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
    online: OnlineEpisodes | None = None  # feedback by response id; with [online] enabled, ends idle episodes

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
        from proxy.render import Renderer, load_template

        try:
            await self._start_engine()
            tokenizer = getattr(self.engine, "tokenizer", None)
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.engine.info.model_path)
            e = self.cfg.engine
            template = load_template(e.chat_template)
            eos = self.engine.info.eos_token_ids
            self.renderer = Renderer(tokenizer, eos, template, e.tool_parser, e.reasoning_parser)
            log.info("reply parsers: tools %s, reasoning %s", *self.renderer.parsers.names)
            default_max = self.cfg.proxy.default_max_tokens
            self.completions = CompletionService(
                self.engine, self.renderer, self.db, self.sessions, default_max, e.tool_call_grammar, self.cfg.online
            )
            if self.online is not None:
                self.online.busy = self.completions.busy
            # What start-up built (the app, the tokenizer, transformers' modules: hundreds of thousands of
            # objects) moves to the collector's permanent generation, so its full passes, which would walk
            # all of it in the middle of serving, see only what requests make.
            gc.freeze()
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
        self.metrics.inc("areal_history_rewrites_total", sum(r.segment for r in results))
        self.metrics.observe("areal_request_seconds", time.perf_counter() - started, api=api)
