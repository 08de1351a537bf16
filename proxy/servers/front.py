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
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_from_bytes, unquote, urlsplit

import aiohttp
from pydantic import ValidationError

from proxy.config import Config, ConfigError, FrontConfig
from proxy.engines.http1 import UpstreamError, UpstreamPool
from proxy.errors import APIError, unauthorized
from proxy.schemas.common import validation_error
from proxy.schemas.control import Weights
from proxy.servers.relay import HOP_BY_HOP, Request, Responder, relay
from proxy.sessions import bearer

log = logging.getLogger("areal_front")

_SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")
"""Headers aiohttp would add to a pushed request that lacks them: the client's own go through, or none."""
_UNSAFE_IN_URL = re.compile(rb"[^\x21-\x7e]")  # a request target is relayed as it came, bar bytes a URL may not hold
_URL_SAFE = bytes(range(0x21, 0x7F))
_KEEP_ALIVE_S = 15.0  # idle connections to replicas; below their servers' (`proxy.servers.http.KEEP_ALIVE_S`)
_NOT_FORWARDED = HOP_BY_HOP | {b"content-length", b"expect"}  # the front sets the length; the body is already read


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
    """The front's request handling; `proxy.servers.relay` is its HTTP."""

    def __init__(self, cfg: FrontConfig, max_request_bytes: int, admin_key: str = "") -> None:
        if not cfg.replicas:
            raise ConfigError("the front needs replicas: --replicas URL1,URL2 or [front] replicas = [...]")
        self.cfg = cfg
        self.max_request_bytes = max_request_bytes
        self.admin_key = admin_key
        self.router = Router(cfg.replicas)
        self.pool = UpstreamPool(connect_timeout_s=min(5.0, cfg.timeout_s), keep_alive_s=_KEEP_ALIVE_S)
        self.client: aiohttp.ClientSession | None = None  # health checks and weight pushes
        self.weights: tuple[bytes, list[tuple[bytes, bytes]], int] | None = None  # last pushed: body, headers, version
        self._weights_lock: asyncio.Lock | None = None
        self._health_task: asyncio.Task | None = None
        self._prefixes = {r.url: _prefix_and_host(r.url) for r in self.router.replicas}
        self._names = {r.url: r.url.encode() for r in self.router.replicas}

    async def handle(self, request: Request, responder: Responder) -> None:
        raw_path = request.target.split(b"?", 1)[0]
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path)
        if path == "/health" and request.method == b"GET":
            await self._health(responder.send)
            return
        headers = _forward_headers(request)
        if path == "/weights" and request.method == b"POST":
            responder.cancellable = False  # a push goes on to every replica even if its client hangs up
            refusal = self._check_push(request.headers, request.body)
            if refusal is not None:
                await _send_error(responder.send, refusal)
                return
            await self._push_weights(request.body, headers, responder.send)
            return
        await self._forward(request, path, headers, responder)

    # -- forwarding -------------------------------------------------------------------
    async def _forward(
        self, request: Request, path: str, headers: list[tuple[bytes, bytes]], responder: Responder
    ) -> None:
        target = request.target
        if _UNSAFE_IN_URL.search(target):
            target = quote_from_bytes(target, safe=_URL_SAFE).encode()
        auth = {k.decode(): v.decode("latin-1") for k, v in headers if k in (b"authorization", b"x-api-key")}
        key = routing_key(path, auth)
        lines = [b"%s: %s\r\n" % (k, v) for k, v in headers]
        has_host = any(k == b"host" for k, _ in headers)
        if request.body or request.method in (b"POST", b"PUT", b"PATCH"):
            lines.append(b"content-length: %d\r\n" % len(request.body))
        tail = b"".join(lines) + b"\r\n" + request.body
        tried: list[Replica] = []
        while True:
            replica = self.router.pick(key, tried)
            if replica is None:
                message = "no proxy replica is available" + (" (all failed for this request)" if tried else "")
                await _send_error(responder.send, replica_failed(message, self.cfg.retry_after_s + 1))
                return
            tried.append(replica)
            replica.in_flight += 1
            replica.requests += 1
            try:
                try:
                    connection = await self.pool.acquire(replica.url)
                except UpstreamError as exc:
                    self.router.mark_failed(replica, str(exc))
                    continue  # the request never reached it: another replica may take it
                prefix, netloc = self._prefixes[replica.url]
                data = b"%s %s%s HTTP/1.1\r\n" % (request.method, prefix, target)
                data += tail if has_host else b"host: %s\r\n%s" % (netloc, tail)
                named = [(b"x-areal-replica", self._names[replica.url])]
                try:
                    cut = await relay(connection, responder, data, named, self.cfg.timeout_s)
                except UpstreamError as exc:
                    await self._failed_under_request(replica, exc, responder.send)
                    return
                if cut is not None and not cut.timeout:  # bytes went out: the client sees a cut answer
                    self.router.mark_failed(replica, f"broke off an answer ({cut})")
                return
            finally:
                replica.in_flight -= 1

    async def _failed_under_request(self, replica: Replica, exc: UpstreamError, send: Any) -> None:
        if not exc.timeout:
            self.router.mark_failed(replica, f"failed under a request ({exc})")
        message = f"proxy replica {replica.url} failed before answering ({exc}); retry the request"
        await _send_error(send, replica_failed(message, self.cfg.retry_after_s))

    # -- weights ----------------------------------------------------------------------
    def _check_push(self, headers: list[tuple[bytes, bytes]], body: bytes) -> APIError | None:
        """A push is checked here before it fans out: the admin key (when one is set) and the body."""
        if self.admin_key:
            raw = dict(headers)
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

    async def startup(self) -> None:
        self.client = _http_client(self.cfg.timeout_s)
        self._weights_lock = asyncio.Lock()
        await self.check_replicas()
        self._health_task = asyncio.create_task(self._health_loop())
        log.info("front over %s", ", ".join(r.url for r in self.router.replicas))

    async def shutdown(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self.client is not None:
            await self.client.close()
        self.pool.close()


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


def _prefix_and_host(url: str) -> tuple[bytes, bytes]:
    """What a replica's URL puts before each target (a path it is served under), and its Host."""
    parts = urlsplit(url)
    return parts.path.rstrip("/").encode(), parts.netloc.encode()


def _forward_headers(request: Request) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop ones; Host stays, so replicas build URLs to the front."""
    headers = [(k, v) for k, v in request.headers if k not in _NOT_FORWARDED]
    if request.client:
        headers.append((b"x-forwarded-for", request.client.encode()))
    return headers


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
    dropped = HOP_BY_HOP | {b"content-length"}
    headers = [(k, v) for k, v in response.raw_headers if k.lower() not in dropped]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


def serve_front(cfg: Config) -> int:
    """Run the front until interrupted: 0 on a clean stop, 1 if it never started."""
    from proxy.servers.http import check_exposure
    from proxy.servers.relay import serve_forever

    check_exposure(cfg.front.host, cfg.proxy.admin_key, "the front")
    front = Front(cfg.front, cfg.proxy.max_request_bytes, cfg.proxy.admin_key)
    return serve_forever(
        front.handle,
        front.startup,
        front.shutdown,
        cfg.front.host,
        cfg.front.port,
        cfg.proxy.max_request_bytes,
        "the front",
    )
