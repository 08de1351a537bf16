"""`areal-proxy serve`: load reward modules, build the app, run it under uvicorn."""

from __future__ import annotations

import logging
import sys

from proxy.config import Config

log = logging.getLogger("areal_proxy")

KEEP_ALIVE_S = 65
"""How long our servers (proxy, engine, front) keep an idle client connection open.

Above the idle expiry of the clients that call them (httpx and so the OpenAI SDKs: 5 s, our
engine pool: 3 s, aiohttp: 15 s). With uvicorn's default of 5 s a client could reuse a
connection at the moment the server closed it, and the request failed with "server
disconnected" without ever reaching the server: a 1-in-60 event here for requests 5 s apart.
"""


def serve(cfg: Config) -> int:
    import uvicorn

    from proxy.app import create_app
    from proxy.store.db import StoreLocked
    from rewards.registry import load_modules

    try:
        loaded = load_modules(cfg.rewards.modules)
    except (ImportError, FileNotFoundError, ValueError) as exc:
        print(f"areal-proxy: cannot load reward modules: {exc}", file=sys.stderr)
        return 2
    if loaded:
        log.info("reward functions loaded: %s", ", ".join(loaded))
    try:
        app = create_app(cfg)
    except StoreLocked as exc:
        print(f"areal-proxy: {exc}", file=sys.stderr)
        return 1
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=cfg.proxy.host,
            port=cfg.proxy.port,
            log_level=cfg.proxy.log_level,
            access_log=cfg.proxy.log_level == "debug",
            timeout_graceful_shutdown=10,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
    )
    server.run()
    return 0 if server.started else 1
