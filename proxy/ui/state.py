"""What the UI's routes share: the store, the run directory, the admin key and a token decoder.

Inside `areal-proxy serve` it reads the proxy's own store and borrows its renderer's tokenizer
once the engine has loaded; alone (`areal-proxy ui`) it opens the store itself and loads the
configured model's tokenizer file on first need, without torch.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from proxy.config import Config
from proxy.errors import unauthorized
from proxy.store.db import Database
from proxy.ui.tokens import Decode, decoder_of, load_decoder

log = logging.getLogger(__name__)


@dataclass
class UIState:
    cfg: Config
    db: Database
    run_dir: Path
    admin_key: str
    tokenizer: Callable[[], object | None] | None = None
    """The running proxy's tokenizer, when there is one (None while its engine loads)."""
    _decoder: Decode | None = field(default=None, init=False)
    _loaded: bool = field(default=False, init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    def authorized(self, token: str | None) -> bool:
        return not self.admin_key or (token is not None and hmac.compare_digest(token, self.admin_key))

    def require_admin(self, token: str | None) -> None:
        if self.admin_key and token is None:
            raise unauthorized("the UI's data needs the admin key as a bearer token")
        if not self.authorized(token):
            raise unauthorized("invalid admin key")

    async def decoder(self) -> Decode | None:
        """How to turn token ids into text; None when no tokenizer can be had (ids are shown)."""
        if self.tokenizer is not None:
            tokenizer = self.tokenizer()
            return decoder_of(tokenizer) if tokenizer is not None else None
        async with self._lock:
            if not self._loaded:
                self._decoder = await asyncio.to_thread(self._load)
                self._loaded = True
        return self._decoder

    def _load(self) -> Decode | None:
        from proxy.runtime.model_files import resolve_model

        engine = self.cfg.engine
        try:
            return load_decoder(resolve_model(engine.model, engine.cache_dir))
        except (OSError, ValueError) as exc:  # the page shows token ids instead; say why once
            log.warning("cannot load the tokenizer of %s (%s): the UI shows token ids", engine.model, exc)
            return None
