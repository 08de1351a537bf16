"""The engine servers behind the SGLang and vLLM backends, and how requests are routed to them.

A conversation (`affinity`) sticks to one server while that server is alive, so the server's
prefix cache is reused turn after turn; a new conversation goes to the live server with the
fewest requests in flight. A server that fails (connect error, timeout, 5xx, malformed answer)
leaves rotation for `retry_dead_after_s`, then is tried again. A request that fails before its
first token is retried on another server, at most `retries` times; once tokens were streamed a
failure surfaces as `EngineUnavailable`, never as a second, duplicate generation.

Also here, because both HTTP backends need them: server-sent-event reading, error bodies → the
engine errors, and weight-version labels → integer versions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Collection, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from proxy.engines.base import EngineRequestError, EngineUnavailable, StreamDelta
from proxy.engines.http1 import UpstreamError, UpstreamPool, host_line, post, streamed_post

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """One engine server failed; `dead` takes it out of rotation (False for 429: busy, not broken)."""

    def __init__(self, message: str, *, dead: bool = True) -> None:
        super().__init__(message)
        self.dead = dead


@dataclass(eq=False)
class Server:
    url: str
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    dead_until: float = 0.0
    last_error: str = ""

    def alive(self, now: float) -> bool:
        return now >= self.dead_until


class ServerPool:
    """Routing state of the engine servers: pure bookkeeping, no network."""

    def __init__(
        self,
        urls: list[str],
        *,
        retries: int = 2,
        dead_after_s: float = 10.0,
        max_affinities: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("engine.urls is empty: list the engine server base URLs")
        self.servers = [Server(url.rstrip("/")) for url in dict.fromkeys(urls)]
        self.retries = retries
        self.dead_after_s = dead_after_s
        self.max_affinities = max_affinities
        self._clock = clock
        self._affinity: OrderedDict[str, Server] = OrderedDict()
        self._pinned: Counter[str] = Counter()
        self._turn = 0

    def live(self) -> list[Server]:
        now = self._clock()
        return [s for s in self.servers if s.alive(now)]

    def pick(self, affinity: str | None = None, exclude: Collection[Server] = ()) -> Server:
        """The pinned server of `affinity` if it is usable, else the least busy live server."""
        candidates = [s for s in self.live() if s not in exclude]
        if not candidates:
            raise EngineUnavailable(self.unavailable_message(exclude))
        if affinity is not None:
            pinned = self._affinity.get(affinity)
            if pinned in candidates:
                self._affinity.move_to_end(affinity)
                return pinned
        n = len(self.servers)
        order = {s.url: (i - self._turn) % n for i, s in enumerate(self.servers)}
        self._turn += 1
        server = min(candidates, key=lambda s: (s.in_flight, self._pinned[s.url], order[s.url]))
        if affinity is not None:
            self._pin(affinity, server)
        return server

    def _pin(self, affinity: str, server: Server) -> None:
        old = self._affinity.pop(affinity, None)
        if old is not None:
            self._pinned[old.url] -= 1
        self._affinity[affinity] = server
        self._pinned[server.url] += 1
        while len(self._affinity) > self.max_affinities:
            _, evicted = self._affinity.popitem(last=False)
            self._pinned[evicted.url] -= 1

    def mark_failed(self, server: Server, error: str) -> None:
        server.failures += 1
        server.last_error = error
        server.dead_until = self._clock() + self.dead_after_s
        log.warning("engine server %s out of rotation for %.0f s: %s", server.url, self.dead_after_s, error)

    def mark_ok(self, server: Server) -> None:
        server.dead_until = 0.0

    def unavailable_message(self, exclude: Collection[Server] = ()) -> str:
        now = self._clock()
        parts = []
        for s in self.servers:
            if s in exclude:
                parts.append(f"{s.url} already failed for this request ({s.last_error})")
            elif not s.alive(now):
                parts.append(f"{s.url} back in rotation in {s.dead_until - now:.1f} s ({s.last_error})")
        return "no engine server is available: " + "; ".join(parts)

    def stats(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [
            {
                "url": s.url,
                "alive": s.alive(now),
                "in_flight": s.in_flight,
                "requests": s.requests,
                "failures": s.failures,
                "affinities": self._pinned[s.url],
                "last_error": s.last_error or None,
                "retry_in_s": max(0.0, round(s.dead_until - now, 1)),
            }
            for s in self.servers
        ]

    async def stream(
        self,
        affinity: str | None,
        open_stream: Callable[[Server], AsyncIterator[StreamDelta]],
    ) -> AsyncIterator[StreamDelta]:
        """Run `open_stream` on a picked server, retrying on another one until a token arrived."""
        tried: list[Server] = []
        errors: list[str] = []
        for _ in range(self.retries + 1):
            try:
                server = self.pick(affinity, exclude=tried)
            except EngineUnavailable:
                if not errors:
                    raise
                break
            tried.append(server)
            server.in_flight += 1
            server.requests += 1
            produced = False
            try:
                async with aclosing(open_stream(server)) as deltas:
                    async for delta in deltas:
                        produced = True
                        yield delta
                return
            except ServerError as exc:
                if exc.dead:
                    self.mark_failed(server, str(exc))
                if produced:
                    raise EngineUnavailable(f"engine server {server.url} failed mid-generation: {exc}") from exc
                errors.append(f"{server.url}: {exc}")
            finally:
                server.in_flight -= 1
        raise EngineUnavailable(f"engine request failed on {len(errors)} server(s): " + "; ".join(errors))

    async def on_each_live(self, action: Callable[[Server], Awaitable[None]], what: str) -> None:
        """Run `action` on every live server at once; those that fail leave rotation and are named
        in the `EngineUnavailable` raised at the end."""
        servers = self.live()
        if not servers:
            raise EngineUnavailable(self.unavailable_message())
        if skipped := [s.url for s in self.servers if s not in servers]:
            log.warning("%s skips servers out of rotation: %s", what, skipped)
        results = await asyncio.gather(*(action(s) for s in servers), return_exceptions=True)
        errors = []
        for server, result in zip(servers, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # cancellation
            if isinstance(result, Exception):
                self.mark_failed(server, f"{what} failed: {result}")
                errors.append(f"{server.url}: {result}")
        if errors:
            raise EngineUnavailable(f"{what} failed on " + "; ".join(errors))

    async def check_health(self, client: aiohttp.ClientSession, path: str = "/health") -> None:
        """GET `path` on every server: a 2xx puts it back in rotation, anything else takes it out."""

        async def ping(server: Server) -> None:
            try:
                with http_errors(server.url + path):
                    async with client.get(server.url + path) as response:
                        await raise_for_status(response)
                self.mark_ok(server)
            except (ServerError, EngineRequestError) as exc:
                self.mark_failed(server, f"health check: {exc}")

        await asyncio.gather(*(ping(s) for s in self.servers))
        if not self.live():
            raise EngineUnavailable(self.unavailable_message())


# ---- what both HTTP backends share on the wire ----


ENGINE_KEEP_ALIVE_S = 3.0  # idle connections to engine servers; below their servers' 5 s


def http_client(timeout_s: float, api_key: str = "") -> aiohttp.ClientSession:
    """One pooled client per engine (created on the running loop), sending `api_key` as its bearer
    key when there is one; proxy env vars are ignored.

    aiohttp rather than httpx on this path: measured here, httpx spent ~2 ms of CPU per request
    at 32 in flight (its pool scans and polls every idle connection per request), aiohttp 0.1 ms.
    `timeout_s` bounds the connect and each wait for data, not a whole (long) generation.
    Idle connections are dropped after `ENGINE_KEEP_ALIVE_S`, before a server under uvicorn's
    default keep-alive (5 s; SGLang and vLLM serve with uvicorn) drops them: a request sent on
    a connection the server was closing at that moment fails unsent, and took a healthy server
    out of rotation (a session then moved to another server: seen in CI). No cookie jar: engines
    set no cookie the proxy needs, and a jar would carry one server's cookies to the others (and
    filters them on every request).
    """
    timeout = aiohttp.ClientTimeout(total=None, connect=min(timeout_s, 10.0), sock_read=timeout_s)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=ENGINE_KEEP_ALIVE_S)
    return aiohttp.ClientSession(
        timeout=timeout,
        connector=connector,
        headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        trust_env=False,
        json_serialize=lambda obj: orjson.dumps(obj).decode(),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


@contextmanager
def http_errors(url: str) -> Iterator[None]:
    """Turn transport failures towards `url` into `ServerError`."""
    try:
        yield
    except TimeoutError as exc:  # asyncio's and aiohttp's timeouts
        raise ServerError(f"{url} timed out ({type(exc).__name__})") from exc
    except aiohttp.ClientError as exc:
        raise ServerError(f"{url} unreachable ({type(exc).__name__}: {exc})") from exc


def error_from_body(body: Any, status: int) -> Exception:
    """The engine error for an error answer: nested OpenAI shape, flat shape, or plain text."""
    err = body.get("error", body) if isinstance(body, dict) else body
    message = err
    if isinstance(err, dict):
        message = err.get("message") or err.get("detail") or json.dumps(err)
        code = err.get("code")
        if isinstance(code, int) and 400 <= code < 600:
            status = code
    message = str(message) or f"HTTP {status}"
    if status == 429:
        return ServerError(f"busy: {message}", dead=False)
    if 400 <= status < 500:
        return EngineRequestError(message)
    return ServerError(f"HTTP {status}: {message}")


async def raise_for_status(response: aiohttp.ClientResponse) -> None:
    if response.status >= 400:
        raise error_from_answer(await response.read(), response.status)


def error_from_answer(raw: bytes, status: int) -> Exception:
    """The engine error for an error answer's raw body (JSON or text)."""
    text = raw.decode(errors="replace")
    try:
        body: Any = json.loads(text)
    except json.JSONDecodeError:
        body = text.strip()
    return error_from_body(body, status)


async def post_json(client: aiohttp.ClientSession, url: str, body: Any = None, **kwargs: Any) -> Any:
    """POST and return the decoded JSON answer (None for an empty one); errors as engine errors."""
    with http_errors(url):
        async with client.post(url, json=body, **kwargs) as response:
            await raise_for_status(response)
            raw = await response.read()
    return answer_json(raw, url)


class Poster:
    """POSTs of pre-encoded JSON to the engine servers over `proxy.engines.http1`'s pooled
    connections: generations, answered whole or streamed. Same timeouts, keep-alive, bearer key and
    errors as `http_client`'s, at a fraction of aiohttp's CPU a call."""

    def __init__(self, timeout_s: float, api_key: str = "") -> None:
        self.pool = UpstreamPool(connect_timeout_s=min(timeout_s, 10.0), keep_alive_s=ENGINE_KEEP_ALIVE_S)
        self.timeout_s = timeout_s
        self.auth = b"authorization: Bearer %s\r\n" % api_key.encode() if api_key else b""
        self._targets: dict[str, tuple[bytes, bytes]] = {}  # server + route -> (request target, header lines)

    async def post_json(self, server: str, route: str, payload: bytes) -> Any:
        url = server + route
        path, headers = self._target(server, route)
        with upstream_errors(url):
            status, raw = await post(self.pool, server, path, payload, headers, self.timeout_s)
        if status >= 400:
            raise error_from_answer(raw, status)
        return answer_json(raw, url)

    def stream(self, server: str, route: str, payload: bytes) -> Any:
        """`async with poster.stream(...) as answer`: the answer as it arrives (`http1.Streamed`);
        leaving early closes the connection, so the server stops generating."""
        path, headers = self._target(server, route)
        return streamed_post(self.pool, server, path, payload, headers, self.timeout_s)

    def _target(self, server: str, route: str) -> tuple[bytes, bytes]:
        url = server + route
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            headers = host_line(server) + b"content-type: application/json\r\n" + self.auth
            target = self._targets[url] = (path.encode(), headers)
        return target

    def close(self) -> None:
        self.pool.close()


@contextmanager
def upstream_errors(url: str) -> Iterator[None]:
    """Turn `http1` failures towards `url` into `ServerError`, as `http_errors` does aiohttp's."""
    try:
        yield
    except UpstreamError as exc:
        raise ServerError(f"{url} {'timed out' if exc.timeout else 'unreachable'} ({exc})") from exc


async def post_ok(client: aiohttp.ClientSession, url: str, body: Any = None) -> str:
    """POST and return the answer's text, for routes that answer a success in words (vLLM's LoRA
    routes); errors as engine errors."""
    with http_errors(url):
        async with client.post(url, json=body) as response:
            await raise_for_status(response)
            return (await response.read()).decode(errors="replace")


async def get_json(client: aiohttp.ClientSession, url: str) -> Any:
    with http_errors(url):
        async with client.get(url) as response:
            await raise_for_status(response)
            raw = await response.read()
    return answer_json(raw, url)


def answer_json(raw: bytes, url: str) -> Any:
    if not raw.strip():
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        text = raw[:200].decode(errors="replace")
        raise ServerError(f"{url} answered with something other than JSON: {text!r}") from exc


async def sse_events(chunks: AsyncIterable[bytes]) -> AsyncIterator[list[bytes]]:
    """The `data:` payloads of the server-sent events (`[DONE]` included) in a byte stream, as
    lists: the events each read of the stream completed. Events a server sent in one burst (the
    tokens it made while the proxy was busy) are then handled as one.

    Lines are split here, not by the HTTP client: an event with every logprob so far can be
    longer than a client's line limit.
    """
    pending = bytearray()
    lines: list[bytes] = []

    def complete(raw: bytes) -> bytes | None:
        line = raw.rstrip(b"\r")
        if line.startswith(b"data:"):
            lines.append(line[5:].lstrip())
        elif not line and lines:
            event = b"\n".join(lines)
            lines.clear()
            return event
        return None

    async for chunk in chunks:
        pending += chunk
        if b"\n" not in chunk:
            continue
        *done, rest = pending.split(b"\n")
        pending = bytearray(rest)
        events = [event for event in map(complete, done) if event is not None]
        if events:
            yield events
    if pending:
        complete(bytes(pending))
    if lines:
        yield [b"\n".join(lines)]


def decode_event(data: bytes, url: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:  # NaN or Infinity, which Python's json module writes and orjson refuses
            return json.loads(data)
        except ValueError as exc:
            raise ServerError(f"{url} sent a malformed stream event: {data[:200]!r}") from exc


class WeightVersions:
    """Engine weight-version labels (strings) ↔ the proxy's integer versions.

    Int-like labels are the version itself; any other label ("default", "step-3") maps to
    the version that was current when it was first seen, or to the one it was set with.
    """

    def __init__(self) -> None:
        self.current = 0
        self._labels: dict[str, int] = {}

    def set(self, label: str, version: int) -> None:
        self._labels[label] = version
        self.current = max(self.current, version)

    def to_int(self, label: Any) -> int:
        if label is None:
            return self.current
        label = str(label)
        if label not in self._labels:
            try:
                self._labels[label] = int(label)
            except ValueError:
                self._labels[label] = self.current
        version = self._labels[label]
        self.current = max(self.current, version)
        return version

    def per_token(self, spans: Any, label: Any, start: int, count: int) -> list[int]:
        """Versions of output tokens start..start+count from `[{version, start, end}]` spans."""
        fallback = self.to_int(label)
        versions = [fallback] * count
        for span in spans or ():
            version = self.to_int(span.get("version"))
            lo, hi = max(int(span.get("start", 0)), start), min(int(span.get("end", 0)), start + count)
            for i in range(lo, hi):
                versions[i - start] = version
        return versions
