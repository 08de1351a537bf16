"""Running an ASGI app under uvicorn, the same way for every server of ours: the proxy, the
`areal-proxy engine` server and the front."""

from __future__ import annotations

import ipaddress
from typing import Any

from proxy.config import ConfigError

KEEP_ALIVE_S = 65
"""How long our servers (proxy, engine, front) keep an idle client connection open.

Above the idle expiry of the clients that call them (httpx and so the OpenAI SDKs: 5 s, our
engine pool: 3 s, aiohttp: 15 s). With uvicorn's default of 5 s a client could reuse a
connection at the moment the server closed it, and the request failed with "server
disconnected" without ever reaching the server: a 1-in-60 event here for requests 5 s apart.
"""


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a server on this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to a public address
        return False


def check_exposure(host: str, admin_key: str, what: str) -> None:
    """Refuse to serve off this machine without an admin key: anyone who can reach the port could
    read every recorded session, push weights, or run the engine."""
    if not admin_key and not is_loopback(host):
        raise ConfigError(
            f"{what} would listen on {host} without an admin key, open to anyone who can reach it. "
            "Set one (--admin-key KEY, [proxy] admin_key, or the AREAL_ADMIN_KEY environment variable), "
            "or bind 127.0.0.1."
        )


def run_uvicorn(app: Any, host: str, port: int, log_level: str, *, admin_key: str, what: str, **extra: Any) -> int:
    """Serve `app` until interrupted, as every server of ours runs (proxy, engine, front): off
    loopback only with an admin key, access log only at debug, 10 s to finish in-flight requests,
    idle connections kept `KEEP_ALIVE_S`. 0 on a clean stop, 1 if it never started."""
    import uvicorn

    check_exposure(host, admin_key, what)
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
