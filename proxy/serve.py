"""`areal-proxy serve`: load reward modules, build the app, run it under uvicorn."""

from __future__ import annotations

import logging
import os
import sys

from proxy.config import Config

log = logging.getLogger("areal_proxy")


def serve(cfg: Config) -> int:
    # Each request tokenizes one prompt, many requests at once: the Rust tokenizer's thread pool would
    # only add hand-offs and spinning workers on the cores serving them (a short prompt: ~80 µs of CPU
    # with it, ~50 without). A user's own setting wins.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
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
    from proxy.servers.http import run_uvicorn

    return run_uvicorn(
        app, cfg.proxy.host, cfg.proxy.port, cfg.proxy.log_level, admin_key=cfg.proxy.admin_key, what="the proxy"
    )
