"""What every route needs to answer: JSON and SSE encoding, and errors in its API's shape
(OpenAI's everywhere, Anthropic's on the Messages routes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.responses import Response, StreamingResponse

from proxy.errors import APIError

T = TypeVar("T")


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json", headers=headers)


def error_response(exc: APIError) -> Response:
    return Response(exc.json(), status_code=exc.status, media_type="application/json", headers=exc.headers)


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def is_messages_route(path: str) -> bool:
    """The Anthropic Messages routes, which answer errors in Anthropic's shape."""
    return path.endswith(("/v1/messages", "/v1/messages/count_tokens"))


def anthropic_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error")


def anthropic_error(exc: APIError) -> Response:
    """`{"type": "error", "error": {"type", "message"}}`, as Anthropic's SDK parses it."""
    payload = {"type": "error", "error": {"type": anthropic_type(exc.status), "message": exc.message}}
    return json_response(payload, status=exc.status, headers=exc.headers)


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class EventStream(StreamingResponse):
    """A streamed (SSE) answer whose pieces go out as one write for each burst.

    The route's generator runs as a task of its own and this response sends whatever it produced
    since the last write: events produced together (several tokens an engine sent at once, the
    finish, usage and `[DONE]` events at the end) cost one `send`, one socket write, where Starlette's
    response pays one each, and the last piece closes the answer without an empty message after it.
    An event is never held back: it waits only while the previous write is being sent. A client that
    hangs up cancels the generator, so its generation, as Starlette's response does on the ASGI 2.3
    servers uvicorn is, without anyio's task group around every answer.
    """

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        loop = asyncio.get_running_loop()
        pending: list[bytes] = []
        waiter: asyncio.Future | None = None

        def wake(_: Any = None) -> None:
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        async def produce() -> None:
            async for piece in self.body_iterator:
                pending.append(piece if isinstance(piece, bytes) else piece.encode(self.charset))
                wake()

        producer = asyncio.create_task(produce())
        producer.add_done_callback(wake)
        hangup = asyncio.create_task(_hung_up(receive))
        hangup.add_done_callback(lambda done: done.cancelled() or producer.cancel())
        try:
            while True:
                if producer.done():
                    if producer.cancelled():  # the client hung up: nobody to answer
                        return
                    if producer.exception() is not None:  # what it made is sent; the server then drops
                        if pending:  # the connection: the client sees a cut answer
                            await send({"type": "http.response.body", "body": b"".join(pending), "more_body": True})
                        producer.result()
                    await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})
                    break
                if not pending:
                    waiter = loop.create_future()
                    await waiter
                    waiter = None
                    continue
                data = b"".join(pending)
                pending.clear()
                await send({"type": "http.response.body", "body": data, "more_body": True})
        finally:
            hangup.cancel()
            producer.cancel()
        if self.background is not None:
            await self.background()


async def _hung_up(receive: Any) -> None:
    """Returns once the client has hung up."""
    while (await receive())["type"] != "http.disconnect":
        pass


class JsonRequest(Request):
    """A request whose JSON body orjson parses: strict JSON (no NaN, no lone surrogates, integers
    within 64 bits, nesting within 1,024 levels), any violation a `JSONDecodeError` FastAPI turns
    into a 400; the standard library's parser let a lone surrogate through to fail later as a 500."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """The route class of every router: bodies are parsed by `JsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return route


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled if the client hangs up before it is done (then `ClientDisconnect`, which the
    app logs as a 499): a non-streamed answer nobody waits for is not generated to its end."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_hung_up(request.receive))
    watcher.add_done_callback(lambda done: done.cancelled() or task.cancel())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            raise ClientDisconnect from None
        raise
    finally:
        watcher.cancel()
