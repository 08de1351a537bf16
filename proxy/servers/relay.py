"""The front's HTTP/1.1 plumbing: client connections served as asyncio protocols over httptools (the
parser uvicorn uses), with nothing in between; replica connections pooled by `proxy.engines.http1`.

A relayed request costs one write to the replica and, for each piece of its answer, one write to the
client (the status line and headers go out with the first piece), from the parsers' callbacks: no
ASGI messages, no task or queue per piece, no client library building a request. The front measured
0.30 ms of CPU per request under uvicorn and aiohttp; what this costs is in docs/benchmarks.md.

Requests on a client connection are answered one at a time, in order (pipelined ones wait, the
connection's reading paused meanwhile); a body larger than the limit is answered 413 and the
connection closed; a request line or header the parser refuses, 400. A client that hangs up cancels
its request's handler, which closes the replica's connection under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import httptools
import orjson

from proxy.engines.http1 import UpstreamConnection, UpstreamError

log = logging.getLogger("areal_front")

HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade",
}  # fmt: skip
_NO_BODY = {204, 304}
_IDLE_CLIENT_S = 65.0  # an idle client connection is closed after this (`proxy.servers.http.KEEP_ALIVE_S`)
_HIGH_WATER = 256 * 1024  # a slow client's unsent bytes above which its replica connection stops being read


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _error_body(message: str, kind: str) -> bytes:
    """An error the front makes itself, in OpenAI's shape."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


class Request:
    """One request as the client sent it, its body whole."""

    __slots__ = ("method", "target", "headers", "body", "keep_alive", "client", "http10")

    def __init__(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], client: str) -> None:
        self.method = method
        self.target = target
        self.headers = headers  # names lowercased
        self.body = b""
        self.keep_alive = True
        self.client = client
        self.http10 = False  # an HTTP/1.0 client: no chunked answers, the end of one is the connection's


class Responder:
    """Writes one answer to the client: the head held until the first piece of the body, so an answer
    can still become an error until a byte of it has gone out; chunked unless its length is known."""

    def __init__(self, connection: ClientConnection, request: Request) -> None:
        self.connection = connection
        self.request = request
        self.head: bytes | None = None
        self.chunked = False
        self.started = False  # a byte of the answer went out
        self.finished = False
        self.cancellable = True  # a hang-up cancels the handler (not for work that must finish, as a weight push)
        self._start: dict | None = None  # an ASGI start message waiting for its first body message

    def begin(self, status: int, headers: list[tuple[bytes, bytes]], reason: bytes = b"", length: int | None = None):
        """Set the head (written with the first piece): `headers` without framing or connection ones."""
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason or _reason(status))]
        lines += [b"%s: %s\r\n" % (k, v) for k, v in headers]
        no_body = status in _NO_BODY or self.request.method == b"HEAD"
        if length is not None:
            lines.append(b"content-length: %d\r\n" % length)
        elif not no_body and self.request.http10:
            self.request.keep_alive = False  # its length unknown: the answer ends when the connection closes
        elif not no_body:
            self.chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        if not self.request.keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        self.head = b"".join(lines)
        if no_body:
            self.chunked = False

    def write(self, data: bytes, last: bool = False) -> None:
        if self.finished:
            return
        if self.request.method == b"HEAD":
            data = b""
        if self.chunked:
            framed = b"%x\r\n%s\r\n" % (len(data), data) if data else b""
            if last:
                framed += b"0\r\n\r\n"
        else:
            framed = data
        if self.head is not None:
            framed, self.head = self.head + framed, None
        if framed:
            self.started = True
            self.connection.write(framed)
        if last:
            self.finished = True
            self.connection.answered(self)

    def abort(self) -> None:
        """The answer cannot be finished: the connection is dropped, so the client sees it cut."""
        self.finished = True
        self.connection.close()

    async def send(self, message: dict) -> None:
        """The ASGI `send` of an answer the front makes itself (health, errors, weight pushes)."""
        if message["type"] == "http.response.start":
            self._start = message
            return
        start, self._start = self._start, None
        body, more = message.get("body", b""), message.get("more_body", False)
        if start is not None:
            headers = [(k.lower(), v) for k, v in start.get("headers", [])]
            length = next((int(v) for k, v in headers if k == b"content-length"), None)
            if length is None and not more:
                length = len(body)
            framing = HOP_BY_HOP | {b"content-length"}
            self.begin(start["status"], [(k, v) for k, v in headers if k not in framing], length=length)
        self.write(body, last=not more)


Handler = Callable[[Request, Responder], Awaitable[None]]


class ClientConnection(asyncio.Protocol):
    """A client's connection to the front."""

    def __init__(self, server: RelayServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.client = ""
        self.queue: deque[Request] = deque()  # complete requests not yet answered
        self.building: Request | None = None
        self.body: list[bytes] = []
        self.size = 0
        self.url = b""
        self.responder: Responder | None = None
        self.task: asyncio.Task | None = None
        self.paused_reading = False
        self.on_pause: Callable[[bool], None] | None = None  # the replica connection to pause with a slow client
        self.closed = False
        self.refused = False
        self.idle_timer: asyncio.TimerHandle | None = None

    # -- the connection ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if peer else ""
        transport.set_write_buffer_limits(high=_HIGH_WATER)
        self.server.connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        request = self.building
        if request is not None and request.method:  # hung up mid-upload: a truncated body is never forwarded
            what = f"{request.method.decode()} {request.target[:200].decode('latin-1')}"
            log.info("client disconnected before sending the whole body of %s", what)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        cancellable = self.responder is None or self.responder.cancellable
        if self.task is not None and not self.task.done() and cancellable:
            self.task.cancel()  # the handler closes the replica's connection under it

    def data_received(self, data: bytes) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported by the front")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request: {exc}")

    def pause_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(True)

    def resume_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(False)

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def _arm_idle(self) -> None:
        if self.server.stopping:
            self.close()
        else:
            self.idle_timer = asyncio.get_running_loop().call_later(_IDLE_CLIENT_S, self.close)

    # -- parser callbacks -------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []
        self.size = 0
        self.building = Request(b"", b"", [], self.client)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.building is not None
        self.building.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        request = self.building
        assert request is not None
        request.method = self.parser.get_method()
        request.target = self.url
        request.keep_alive = self.parser.should_keep_alive()
        request.http10 = self.parser.get_http_version() == "1.0"
        length = next((v for k, v in request.headers if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.server.max_request_bytes:
            self._too_big()
            return
        if any(k == b"expect" and v.lower() == b"100-continue" for k, v in request.headers):
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.server.max_request_bytes:
            self._too_big()
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        request = self.building
        if request is None or self.closed:
            return
        request.body = b"".join(self.body)
        self.building, self.body = None, []
        self.queue.append(request)
        if self.task is None:
            self._next()
        elif not self.paused_reading and self.transport is not None:
            self.paused_reading = True  # a pipelined request: answered after the one before
            self.transport.pause_reading()

    # -- answering --------------------------------------------------------------------
    def _next(self) -> None:
        if not self.queue:
            if self.paused_reading and self.transport is not None and not self.closed:
                self.paused_reading = False
                self.transport.resume_reading()
            self._arm_idle()
            return
        request = self.queue.popleft()
        self.responder = Responder(self, request)
        self.task = asyncio.get_running_loop().create_task(self._answer(request, self.responder))

    async def _answer(self, request: Request, responder: Responder) -> None:
        try:
            await self.server.handler(request, responder)
        except asyncio.CancelledError:
            if not self.closed:
                raise
            return  # the client hung up
        except Exception:
            log.exception("the front failed on %s %s", request.method.decode(), request.target[:200])
            if not responder.started:  # an error in OpenAI's shape
                error = _error_body("internal error in the front", "server_error")
                responder.begin(500, [(b"content-type", b"application/json")], length=len(error))
                responder.write(error, last=True)
            else:
                responder.abort()
            return
        if not responder.finished:
            responder.abort()

    def answered(self, responder: Responder) -> None:
        """The answer was written to its end: the next request, or the connection closed."""
        if responder is not self.responder:
            return
        self.responder, self.task, self.on_pause = None, None, None
        if not responder.request.keep_alive:
            self.close()
            return
        self._next()

    def _too_big(self) -> None:
        self._refuse(413, f"request body exceeds the limit of {self.server.max_request_bytes} bytes")

    def _refuse(self, status: int, message: str) -> None:
        """An answer before the request could be read: sent after any answer in progress, then closed."""
        if self.closed or self.refused or self.transport is None:
            return
        self.refused = True  # the parser may go on calling back with the rest of what was read
        body = _error_body(message, "invalid_request_error")
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        data = head % (status, _reason(status), len(body)) + body
        self.building = None
        self.queue.clear()
        self.transport.pause_reading()
        if self.task is None:
            self.write(data)
            self.close()
        else:  # after the answer in progress
            task = self.task

            def after(_: Any) -> None:
                self.write(data)
                self.close()

            task.add_done_callback(after)


class RelayServer:
    """Listens and hands each complete request to `handler`."""

    def __init__(self, handler: Handler, max_request_bytes: int) -> None:
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.connections: set[ClientConnection] = set()
        self.stopping = False
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; the port listened on (the one picked, for 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: ClientConnection(self), host, port, backlog=2048)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float) -> None:
        """Stop listening, close idle connections, give requests in progress `grace_s` to finish."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while True:
            busy = [c for c in self.connections if c.task is not None]
            for c in list(self.connections):
                if c.task is None:
                    c.close()
            if not busy or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        for c in list(self.connections):
            if c.task is not None:
                c.task.cancel()
            c.close()


# ---- the replicas' side ---------------------------------------------------------------


class Exchange:
    """One request relayed: the replica's answer goes to the client as it arrives."""

    def __init__(self, responder: Responder, extra_headers: list[tuple[bytes, bytes]]) -> None:
        self.responder = responder
        self.extra_headers = extra_headers
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.cut: UpstreamError | None = None  # what broke off the answer after bytes of it went out
        self.head_only = responder.request.method == b"HEAD"  # an answer to HEAD has no body, whatever its length

    def head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        kept = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
        length = None
        if not any(k.lower() == b"transfer-encoding" for k, _ in headers):
            value = next((v for k, v in kept if k.lower() == b"content-length"), None)
            if value is not None and value.isdigit():
                length = int(value)
        kept = [(k, v) for k, v in kept if k.lower() != b"content-length"]
        self.responder.begin(status, kept + self.extra_headers, reason, length=length)

    def body(self, data: bytes) -> None:
        self.responder.write(data)

    def complete(self) -> None:
        self.responder.write(b"", last=True)
        if not self.done.done():
            self.done.set_result(None)

    def fail(self, error: UpstreamError) -> None:
        if self.done.done():
            return
        if self.responder.started:
            self.cut = error  # bytes went out: the answer cannot become an error any more
            self.done.set_result(None)
        else:
            self.done.set_exception(error)


async def relay(
    connection: UpstreamConnection,
    responder: Responder,
    data: bytes,
    extra: list[tuple[bytes, bytes]],
    timeout_s: float,
) -> UpstreamError | None:
    """Send `data` (a whole request) on `connection` and relay the answer to `responder`, `extra`
    headers added. None once relayed whole; the error that cut it after bytes went out (the client's
    connection is then dropped, so the client sees a cut answer). Raises `UpstreamError` if the replica
    failed before any byte of the answer went out. Cancelled (the client hung up), the replica's
    connection is closed, so the replica sees the hang-up too."""
    exchange = Exchange(responder, extra)
    client = responder.connection
    client.on_pause = connection.pause
    connection.send(exchange, data, timeout_s)
    try:
        await exchange.done
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            log.info("client disconnected; its request to the replica was closed")
        connection.abandon(exchange)
        raise
    finally:
        client.on_pause = None
    if exchange.cut is not None:
        responder.abort()
    return exchange.cut


def serve_forever(
    handler: Handler,
    startup: Callable[[], Awaitable[None]],
    shutdown: Callable[[], Awaitable[None]],
    host: str,
    port: int,
    max_request_bytes: int,
    what: str,
) -> int:
    """Run the relay until SIGINT or SIGTERM: 0 on a clean stop, 1 if it never started."""
    import signal

    async def main() -> int:
        server = RelayServer(handler, max_request_bytes)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await startup()
        gc.freeze()  # start-up's objects (~107,000 for the front) out of the collector's full passes (26 ms)
        try:
            try:
                bound = await server.start(host, port)
            except OSError as exc:
                log.error("%s could not listen on %s:%d: %s", what, host, port, exc)
                return 1
            log.info("%s listening on http://%s:%d (Ctrl+C to stop)", what, host, bound)
            await stop.wait()
            log.info("%s stopping: finishing requests in progress (10 s at most)", what)
            await server.stop(10.0)
            return 0
        finally:
            await shutdown()

    try:
        import uvloop
    except ImportError:  # the standard event loop works too, slower
        return asyncio.run(main())
    with contextlib.suppress(KeyboardInterrupt):
        return uvloop.run(main())
    return 0
