"""Running an ASGI app under uvicorn, the same way for every server of ours: the proxy, the
`areal-proxy engine` server and the front."""

from __future__ import annotations

from typing import Any

KEEP_ALIVE_S = 65
"""How long our servers (proxy, engine, front) keep an idle client connection open.

Above the idle expiry of the clients that call them (httpx and so the OpenAI SDKs: 5 s, our
engine pool: 3 s, aiohttp: 15 s). With uvicorn's default of 5 s a client could reuse a
connection at the moment the server closed it, and the request failed with "server
disconnected" without ever reaching the server: a 1-in-60 event here for requests 5 s apart.
"""


def run_uvicorn(app: Any, host: str, port: int, log_level: str, **extra: Any) -> int:
    """Serve `app` until interrupted, as every server of ours runs (proxy, engine, front): access
    log only at debug, 10 s to finish in-flight requests, idle connections kept `KEEP_ALIVE_S`.
    0 on a clean stop, 1 if it never started."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=log_level == "debug",
        timeout_graceful_shutdown=10,
        timeout_keep_alive=KEEP_ALIVE_S,
        **extra,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
