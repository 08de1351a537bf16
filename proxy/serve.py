"""`areal-proxy serve`: load reward modules, build the app, run it under uvicorn."""

from __future__ import annotations

import logging
import sys

from proxy.config import Config

log = logging.getLogger("areal_proxy")


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
        )
    )
    server.run()
    return 0 if server.started else 1
