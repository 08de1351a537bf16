"""`areal-proxy front`: one base URL for several proxy replicas.

Clients, episode runners and the trainer talk to the front; it forwards each request as
it came (streamed answers too, byte for byte) to a live replica. A request that names a
session — `/sessions/{id}/...`, or a model call with a session key — goes to the same
replica every time (rendezvous hashing over the live ones) for that replica's caches;
nothing depends on it, since every replica serves every session from the shared store.

Replicas are health-checked; one that fails leaves rotation until it answers again. A
request that could not reach its replica is tried on another one; a request whose replica
fails after receiving it, before any byte of the answer was sent, gets a 503 with
`x-should-retry: true` and `retry-after` in OpenAI's error shape, so SDK clients retry and
land on another replica. `POST /weights` goes to every live replica; one that comes back
behind the last pushed version is given those weights before it serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import Awaitable, Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_from_bytes

import aiohttp
from pydantic import ValidationError
from yarl import URL

from proxy.config import Config, ConfigError, FrontConfig
from proxy.errors import APIError, unauthorized
from proxy.schemas.common import validation_error
from proxy.schemas.control import Weights
from proxy.sessions import bearer

log = logging.getLogger("areal_front")

_HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade",
}  # fmt: skip
_SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")
"""Headers aiohttp would add to a forwarded request that lacks them: the client's own go through, or none."""
_URL_SAFE = bytes(range(0x21, 0x7F))  # a request target is relayed as it came, bar bytes a URL may not hold
_KEEP_ALIVE_S = 15.0  # idle connections to replicas; below their servers' (`proxy.servers.http.KEEP_ALIVE_S`)


@dataclass(eq=False)
class Replica:
    url: str
    alive: bool = False
    version: int | None = None
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    last_error: str = ""

    def stats(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "alive": self.alive,
            "version": self.version,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "failures": self.failures,
            "last_error": self.last_error or None,
        }


def routing_key(path: str, headers: dict[str, str]) -> str | None:
    """The session a request belongs to, as far as the front can tell: path id, else a model call's key."""
    parts = path.split("/", 3)
    if len(parts) > 2 and parts[1] == "sessions" and parts[2]:
        return "session:" + parts[2]
    if path.startswith("/v1/"):
        try:
            token = bearer(headers.get("authorization"), headers.get("x-api-key"))
        except APIError:  # a malformed key: any replica answers its 401
            return None
        if token:
            return "key:" + token
    return None


def _score(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{url}".encode(), digest_size=8).digest(), "big")


class Router:
    """Which replica serves what: pure bookkeeping, no network."""

    def __init__(self, urls: list[str]) -> None:
        self.replicas = [Replica(url.rstrip("/")) for url in dict.fromkeys(urls)]
        self.version: int | None = None  # the newest weights version any replica reported or took
        self._turn = 0

    def serving(self) -> list[Replica]:
        """Live replicas that are not behind the newest weights."""
        newest = self.version
        return [r for r in self.replicas if r.alive and (newest is None or (r.version or 0) >= newest)]

    def pick(self, key: str | None, exclude: Collection[Replica] = ()) -> Replica | None:
        candidates = [r for r in self.serving() if r not in exclude]
        if not candidates:
            return None
        if key is not None:
            return max(candidates, key=lambda r: _score(key, r.url))
        self._turn += 1
        n = len(self.replicas)
        order = {id(r): (i - self._turn) % n for i, r in enumerate(self.replicas)}
        return min(candidates, key=lambda r: (r.in_flight, order[id(r)]))

    def observe(self, replica: Replica, version: int) -> None:
        newest = version if self.version is None else max(self.version, version)
        if not replica.alive:
            state = "is serving" if version >= newest else f"answers, but waits for weights version {newest}"
            log.info("replica %s %s (it has version %d)", replica.url, state, version)
        replica.alive = True
        replica.version = version
        self.version = newest

    def mark_failed(self, replica: Replica, error: str) -> None:
        if replica.alive:
            log.warning("replica %s out of rotation: %s", replica.url, error)
        replica.alive = False
        replica.failures += 1
        replica.last_error = error


def replica_failed(message: str, retry_after: int) -> APIError:
    return APIError(
        503,
        message,
        code="replica_unavailable",
        headers={"retry-after": str(retry_after), "x-should-retry": "true"},
    )


class Front:
    """The ASGI application of the front."""

    def __init__(self, cfg: FrontConfig, max_request_bytes: int, admin_key: str = "") -> None:
        if not cfg.replicas:
            raise ConfigError("the front needs replicas: --replicas URL1,URL2 or [front] replicas = [...]")
        self.cfg = cfg
        self.max_request_bytes = max_request_bytes
        self.admin_key = admin_key
        self.router = Router(cfg.replicas)
        self.client: aiohttp.ClientSession | None = None
        self.weights: tuple[bytes, list[tuple[bytes, bytes]], int] | None = None  # last pushed: body, headers, version
        self._weights_lock: asyncio.Lock | None = None
        self._health_task: asyncio.Task | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if path == "/health" and method == "GET":
            await self._health(send)
            return
        try:
            body = await _read_body(receive, self.max_request_bytes)
        except ClientGone:  # hung up mid-upload: a truncated body is never forwarded
            log.info("client disconnected before sending the whole body of %s %s", method, path)
            return
        if body is None:
            error = APIError(413, f"request body exceeds the limit of {self.max_request_bytes} bytes")
            await _send_error(send, error)
            return
        headers = _forward_headers(scope)
        if path == "/weights" and method == "POST":
            refusal = self._check_push(scope, body)
            if refusal is not None:
                await _send_error(send, refusal)
                return
            await self._push_weights(body, headers, send)
            return
        await _until_disconnect(receive, self._forward(scope, body, headers, send))

    # -- forwarding -------------------------------------------------------------------
    async def _forward(self, scope: dict, body: bytes, headers: list[tuple[bytes, bytes]], send: Any) -> None:
        assert self.client is not None
        target = quote_from_bytes(scope.get("raw_path") or scope["path"].encode(), safe=_URL_SAFE)
        if scope.get("query_string"):
            target += "?" + quote_from_bytes(scope["query_string"], safe=_URL_SAFE)
        sent = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        key = routing_key(scope["path"], dict(sent))
        tried: list[Replica] = []
        while True:
            replica = self.router.pick(key, tried)
            if replica is None:
                message = "no proxy replica is available" + (" (all failed for this request)" if tried else "")
                await _send_error(send, replica_failed(message, self.cfg.retry_after_s + 1))
                return
            tried.append(replica)
            replica.in_flight += 1
            replica.requests += 1
            try:
                url = URL(replica.url + target, encoded=True)  # as the client sent it, not re-quoted
                try:
                    response = await self.client.request(
                        scope["method"],
                        url,
                        data=body or None,
                        headers=sent,
                        skip_auto_headers=_SKIP_AUTO_HEADERS,
                        allow_redirects=False,
                    )
                except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                    self.router.mark_failed(replica, f"unreachable ({type(exc).__name__})")
                    continue  # the request never reached it: another replica may take it
                except (aiohttp.ClientError, TimeoutError) as exc:
                    await self._failed_under_request(replica, exc, send)
                    return
                complete = False
                try:
                    complete = await self._relay(response, replica, send)
                finally:
                    if complete:
                        response.release()  # read to the end: the connection is kept for the next request
                    else:
                        response.close()  # broken off or cancelled: the replica sees the connection close
                return
            finally:
                replica.in_flight -= 1

    async def _relay(self, response: aiohttp.ClientResponse, replica: Replica, send: Any) -> bool:
        """Stream the replica's answer through unchanged, each piece as it arrives; headers go out with
        its first bytes. Whether the whole answer was relayed."""
        headers = [(k, v) for k, v in response.raw_headers if k.lower() not in _HOP_BY_HOP]
        headers.append((b"x-areal-replica", replica.url.encode()))
        start = {"type": "http.response.start", "status": response.status, "headers": headers}
        started = finished = False
        try:
            async for chunk in response.content.iter_any():
                if not started:
                    await send(start)
                    started = True
                finished = response.content.at_eof()  # the last piece closes the answer: no empty message after
                await send({"type": "http.response.body", "body": chunk, "more_body": not finished})
        except (aiohttp.ClientError, TimeoutError) as exc:
            if not started:
                await self._failed_under_request(replica, exc, send)
                return False
            if not isinstance(exc, TimeoutError):
                self.router.mark_failed(replica, f"broke off an answer ({type(exc).__name__})")
            # Bytes were sent: the answer cannot become a 503 any more. Returning without the final
            # body message makes the server drop the connection, so the client sees a cut answer.
            return False
        if not started:
            await send(start)
        if not finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def _failed_under_request(self, replica: Replica, exc: Exception, send: Any) -> None:
        if not isinstance(exc, TimeoutError):  # aiohttp's read timeouts are TimeoutErrors too
            self.router.mark_failed(replica, f"failed under a request ({type(exc).__name__})")
        message = f"proxy replica {replica.url} failed before answering ({type(exc).__name__}); retry the request"
        await _send_error(send, replica_failed(message, self.cfg.retry_after_s))

    # -- weights ----------------------------------------------------------------------
    def _check_push(self, scope: dict, body: bytes) -> APIError | None:
        """A push is checked here before it fans out: the admin key (when one is set) and the body."""
        if self.admin_key:
            raw = dict(scope.get("headers") or [])
            try:
                token = bearer(raw.get(b"authorization", b"").decode("latin-1") or None)
            except APIError as exc:
                return exc
            if token is None or not hmac.compare_digest(token, self.admin_key):
                return unauthorized("pushing weights needs the admin key")
        try:
            Weights.model_validate_json(body)
        except ValidationError as exc:
            return validation_error(exc.errors(), skip=())
        return None

    async def _post_weights(self, replica: Replica, body: bytes, headers: list[tuple[bytes, bytes]]) -> _Answer:
        """POST the weights to one replica and read its whole answer (aiohttp errors propagate)."""
        assert self.client is not None
        sent = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        async with self.client.post(
            replica.url + "/weights", data=body, headers=sent, skip_auto_headers=_SKIP_AUTO_HEADERS
        ) as response:
            return _Answer(response.status, response.raw_headers, await response.read())

    async def _push_weights(self, body: bytes, headers: list[tuple[bytes, bytes]], send: Any) -> None:
        """Every live replica loads the weights; the answer is the last replica's. Once one replica
        has taken them, one that failed or refused is brought up to them later (`_catch_up`)."""
        assert self._weights_lock is not None
        # the front reads these answers: asked for without a content coding, which every client accepts
        headers = [(k, v) for k, v in headers if k.lower() != b"accept-encoding"]
        async with self._weights_lock:
            answer: _Answer | None = None
            for replica in [r for r in self.router.replicas if r.alive]:
                try:
                    response = await self._post_weights(replica, body, headers)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    self.router.mark_failed(replica, f"weight push failed ({type(exc).__name__})")
                    continue
                if response.status != 200:
                    if answer is None and response.status < 500:
                        await _send_response(send, response)  # refused as sent (auth, bad path, old version)
                        return
                    replica.last_error = f"weight push refused: {response.status} {response.text[:200]}"
                    continue
                self.router.observe(replica, int(response.json()["version"]))
                answer = response
            if answer is None:
                await _send_error(send, replica_failed("no proxy replica took the weights", self.cfg.retry_after_s))
                return
            self.weights = (body, headers, int(answer.json()["version"]))
        await _send_response(send, answer)

    async def _catch_up(self) -> None:
        """Give a replica that came back behind the last pushed weights those weights."""
        if self.weights is None or self._weights_lock is None or self.client is None:
            return
        for replica in self.router.replicas:
            async with self._weights_lock:  # never interleaved with a push
                body, headers, version = self.weights
                if not (replica.alive and (replica.version or 0) < version):
                    continue
                try:
                    response = await self._post_weights(replica, body, headers)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    self.router.mark_failed(replica, f"weight catch-up failed ({type(exc).__name__})")
                    continue
            if response.status == 200:
                log.info("replica %s brought up to weights version %d", replica.url, version)
                self.router.observe(replica, int(response.json()["version"]))
            else:
                replica.last_error = f"weight catch-up refused: {response.status} {response.text[:200]}"

    # -- health -----------------------------------------------------------------------
    async def check_replicas(self) -> None:
        await asyncio.gather(*(self._check(r) for r in self.router.replicas))
        await self._catch_up()

    async def _check(self, replica: Replica) -> None:
        assert self.client is not None
        try:
            async with self.client.get(replica.url + "/health", timeout=_HEALTH_TIMEOUT) as response:
                status = response.status
                version = int(json.loads(await response.read())["version"]) if status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            self.router.mark_failed(replica, f"health check: {type(exc).__name__}: {exc}")
            return
        if version is None:
            self.router.mark_failed(replica, f"health check: HTTP {status}")
        else:
            self.router.observe(replica, version)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_interval_s)
            try:
                await self.check_replicas()
            except Exception:  # the next round tries again; forwarding goes on
                log.exception("replica health check failed")

    async def _health(self, send: Any) -> None:
        serving = self.router.serving()
        payload = {
            "status": "ok" if serving else "unavailable",
            "version": self.router.version or 0,
            "serving": len(serving),
            "replicas": [r.stats() for r in self.router.replicas],
        }
        await _send_json(send, 200 if serving else 503, payload)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.client = _http_client(self.cfg.timeout_s)
                self._weights_lock = asyncio.Lock()
                await self.check_replicas()
                self._health_task = asyncio.create_task(self._health_loop())
                log.info("front over %s", ", ".join(r.url for r in self.router.replicas))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._health_task is not None:
                    self._health_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._health_task
                if self.client is not None:
                    await self.client.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


_HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=10)


def _http_client(timeout_s: float) -> aiohttp.ClientSession:
    """The front's one pooled client to the replicas (created on the running loop).

    aiohttp, the client the proxy itself uses towards engine servers (`proxy.engines.pool.http_client`,
    where it measured ~20x less CPU per request than httpx). Bodies come and go byte for byte: no
    decompression (a replica's content coding passes through), no cookies kept between clients, no
    redirects followed, no proxy from the environment. `timeout_s` bounds each wait for the replica's
    data (a generation before its first byte included), not a whole streamed answer; 5 s to connect.
    """
    timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_connect=5.0, sock_read=timeout_s)
    connector = aiohttp.TCPConnector(limit=4096, keepalive_timeout=_KEEP_ALIVE_S)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        auto_decompress=False,
    )


def _forward_headers(scope: dict) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop ones; Host stays, so replicas build URLs to the front."""
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _HOP_BY_HOP and k != b"content-length"]
    client = scope.get("client")
    if client:
        headers.append((b"x-forwarded-for", str(client[0]).encode()))
    return headers


class ClientGone(Exception):
    """The client disconnected."""


async def _until_disconnect(receive: Any, forward: Awaitable[None]) -> None:
    """Run `forward`, cancelling it if the client hangs up: the replica's request is closed with it,
    so the replica cancels the generation, as it does for a client that hangs up on it directly."""
    task = asyncio.ensure_future(forward)

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        await task
    except asyncio.CancelledError:
        if not watcher.done():
            raise
        log.info("client disconnected; its request to the replica was closed")
    finally:
        watcher.cancel()


async def _read_body(receive: Any, limit: int) -> bytes | None:
    """The whole request body (kept, so a request that reached no replica can go to another), or None
    if too big; `ClientGone` if the client hung up before sending all of it."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _send_json(send: Any, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in (headers or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Any, error: APIError) -> None:
    await _send_json(send, error.status, error.body(), error.headers)


@dataclass
class _Answer:
    """A replica's answer read in full, its body as it came."""

    status: int
    raw_headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


async def _send_response(send: Any, response: _Answer) -> None:
    """A replica's answer read in full: re-sent as it came, with its length."""
    dropped = _HOP_BY_HOP | {b"content-length"}
    headers = [(k, v) for k, v in response.raw_headers if k.lower() not in dropped]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


def serve_front(cfg: Config) -> int:
    """Run the front until interrupted."""
    from proxy.servers.http import run_uvicorn

    app = Front(cfg.front, cfg.proxy.max_request_bytes, cfg.proxy.admin_key)
    # the replica's own Date and Server headers pass through
    return run_uvicorn(
        app,
        cfg.front.host,
        cfg.front.port,
        cfg.proxy.log_level,
        admin_key=cfg.proxy.admin_key,
        what="the front",
        server_header=False,
        date_header=False,
    )
