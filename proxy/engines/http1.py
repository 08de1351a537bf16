"""An HTTP/1.1 client over httptools (the parser uvicorn uses) with nothing in between: pooled
keep-alive connections as asyncio protocols, one request at a time each, the answer handed to an
exchange from the parser's callbacks as it arrives.

The front relays its clients' requests to the proxy replicas with it (`proxy.servers.relay`), and
the SGLang and vLLM backends post their one-JSON-answer generations with it (`post`): aiohttp's
request machinery cost 10-15% of the proxy's CPU a call, this a few percent (docs/benchmarks.md).

An exchange is any object with `head_only` and the methods `head(status, reason, headers)`,
`body(data)`, `complete()` and `fail(error)`; `Answer` reads an answer whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools


class Exchange(Protocol):
    head_only: bool

    def head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None: ...
    def body(self, data: bytes) -> None: ...
    def complete(self) -> None: ...
    def fail(self, error: UpstreamError) -> None: ...


class UpstreamError(Exception):
    """The server failed under a request: `unreachable` if the request never reached it."""

    def __init__(self, message: str, unreachable: bool = False, timeout: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable
        self.timeout = timeout


class UpstreamConnection(asyncio.Protocol):
    """One connection to a server, one request at a time, kept for the next while both keep it alive."""

    def __init__(self, pool: UpstreamPool, key: str) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.open = False
        self.last_data = 0.0
        self.idle_since = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.timeout_s = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._stop_timer()
        if self.exchange is not None:
            exchange, self.exchange = self.exchange, None
            what = type(exc).__name__ if exc else "ServerDisconnected"
            exchange.fail(UpstreamError(f"connection lost ({what})"))

    def data_received(self, data: bytes) -> None:
        self.last_data = time.monotonic()
        if self.exchange is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._failed(UpstreamError(f"malformed answer ({exc})"))

    # -- one request --------------------------------------------------------------------
    def send(self, exchange: Exchange, data: bytes, timeout_s: float) -> None:
        assert self.transport is not None
        self.exchange = exchange
        self.reason, self.headers = b"", []
        self.last_data = time.monotonic()
        self.timeout_s = timeout_s
        self.timer = asyncio.get_running_loop().call_later(timeout_s, self._check_timeout)
        self.transport.write(data)

    def pause(self, paused: bool) -> None:
        if self.transport is not None and self.open:
            self.transport.pause_reading() if paused else self.transport.resume_reading()

    def close(self) -> None:
        self.open = False
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()

    def abandon(self, exchange: Any) -> None:
        """Give up `exchange` if it is still this connection's request (its reader left, or was
        cancelled): the connection is closed under it, so the server sees the hang-up."""
        if self.exchange is exchange:
            self.exchange = None
            self.close()

    def _check_timeout(self) -> None:
        self.timer = None
        if self.exchange is None:
            return
        left = self.last_data + self.timeout_s - time.monotonic()
        if left > 0:  # data came meanwhile: wait the rest of the period from the last data
            self.timer = asyncio.get_running_loop().call_later(left, self._check_timeout)
            return
        self._failed(UpstreamError(f"no data for {self.timeout_s:g} s", timeout=True))

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _failed(self, error: UpstreamError) -> None:
        exchange, self.exchange = self.exchange, None
        self.close()
        if exchange is not None:
            exchange.fail(error)

    # -- parser callbacks -----------------------------------------------------------------
    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        exchange = self.exchange
        if exchange is None:
            return
        exchange.head(self.parser.get_status_code(), self.reason, self.headers)
        if exchange.head_only:  # the parser would wait for the body its length announces: not reused
            self.exchange = None
            self.close()
            exchange.complete()

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:
            self.exchange.body(body)

    def on_message_complete(self) -> None:
        exchange, self.exchange = self.exchange, None
        self._stop_timer()
        keep = self.parser.should_keep_alive()
        if exchange is not None:
            exchange.complete()
        if keep and self.open:
            self.pool.release(self)
        else:
            self.close()


class UpstreamPool:
    """Idle keep-alive connections to each server (by the URL given); a new one opened when none is idle."""

    def __init__(self, connect_timeout_s: float, keep_alive_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.keep_alive_s = keep_alive_s
        self.idle: dict[str, list[UpstreamConnection]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def acquire(self, url: str) -> UpstreamConnection:
        idle = self.idle.get(url)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.open and now - connection.idle_since < self.keep_alive_s:
                return connection
            connection.close()
        parts = urlsplit(url)
        secure = parts.scheme == "https"
        if secure and self._ssl is None:
            self._ssl = ssl.create_default_context()
        port = parts.port or (443 if secure else 80)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: UpstreamConnection(self, url),
                    parts.hostname,
                    port,
                    ssl=self._ssl if secure else None,
                )
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"unreachable ({type(exc).__name__})", unreachable=True) from None
        return connection

    def release(self, connection: UpstreamConnection) -> None:
        connection.idle_since = time.monotonic()
        self.idle.setdefault(connection.key, []).append(connection)

    def close(self) -> None:
        for connections in self.idle.values():
            for connection in connections:
                connection.close()
        self.idle.clear()


class Answer:
    """An exchange whose answer is read whole: `await answer.done`, then `status` and `data()`."""

    head_only = False

    def __init__(self) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status = 0
        self._chunks: list[bytes] = []

    def head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status

    def body(self, data: bytes) -> None:
        self._chunks.append(data)

    def complete(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def fail(self, error: UpstreamError) -> None:
        if not self.done.done():
            self.done.set_exception(error)

    def data(self) -> bytes:
        return b"".join(self._chunks)


async def exchange(connection: UpstreamConnection, exchange: Any, data: bytes, timeout_s: float) -> None:
    """Send `data` (a whole request) on `connection` and wait until `exchange` has its answer or failed.
    Cancelled, the connection is closed under the request, so the server sees the hang-up too."""
    connection.send(exchange, data, timeout_s)
    try:
        await exchange.done
    except BaseException:
        connection.abandon(exchange)
        raise


async def post(
    pool: UpstreamPool, server: str, path: bytes, body: bytes, headers: bytes, timeout_s: float
) -> tuple[int, bytes]:
    """POST `body` to `path` on `server` (its base URL, the pool's key) with `headers` (whole header
    lines: a host line, a content type) and return the answer's status and body; `UpstreamError`
    when the server cannot be reached, hangs up or sends nothing for `timeout_s`."""
    connection = await pool.acquire(server)
    answer = Answer()
    await exchange(connection, answer, _post_request(path, headers, body), timeout_s)
    return answer.status, answer.data()


def _post_request(path: bytes, headers: bytes, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\n%scontent-length: %d\r\n\r\n%s" % (path, headers, len(body), body)


class Streamed:
    """An exchange whose answer's body is read as it arrives: `await status()`, then `async for data
    in chunks()`; `UpstreamError` from either when the server fails first."""

    head_only = False

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._status: asyncio.Future[int] = loop.create_future()
        self._pending: list[bytes] = []
        self._wake: asyncio.Future[None] | None = None
        self.finished = False
        self._error: UpstreamError | None = None

    def head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        if not self._status.done():
            self._status.set_result(status)

    def body(self, data: bytes) -> None:
        self._pending.append(data)
        self._signal()

    def complete(self) -> None:
        self.finished = True
        self._signal()

    def fail(self, error: UpstreamError) -> None:
        if self.finished:
            return
        self._error = error
        if not self._status.done():
            self._status.set_exception(error)
        self._signal()

    def _signal(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def status(self) -> int:
        return await self._status

    async def chunks(self) -> AsyncIterator[bytes]:
        """What arrived since the last read, joined, until the answer is complete."""
        while True:
            if self._pending:
                data = b"".join(self._pending)
                self._pending.clear()
                yield data
                continue
            if self._error is not None:
                raise self._error
            if self.finished:
                return
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
            self._wake = None


@contextlib.asynccontextmanager
async def streamed_post(
    pool: UpstreamPool, server: str, path: bytes, body: bytes, headers: bytes, timeout_s: float
) -> AsyncIterator[Streamed]:
    """POST as `post` does and hand over the answer as it arrives. Left before the answer is complete
    (the reader stopped, or was cancelled), the connection is closed under the request, so the server
    sees the hang-up and stops generating."""
    connection = await pool.acquire(server)
    answer = Streamed()
    connection.send(answer, _post_request(path, headers, body), timeout_s)
    try:
        yield answer
    finally:
        connection.abandon(answer)


def host_line(server: str) -> bytes:
    """The `host` header line for requests to `server` (a base URL)."""
    return b"host: %s\r\n" % urlsplit(server).netloc.encode()
