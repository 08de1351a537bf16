"""`EventStream`, the streamed answer of every model route: what a generator produces together goes
out as one write, nothing waits for a later piece, an error cuts the answer after what was made, and
a client that hangs up cancels the generator (so its generation)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.routes.common import EventStream

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


class Client:
    """The ASGI server's side: what was sent, and a receive that reports a hang-up when told to."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def bodies(self) -> list[tuple[bytes, bool]]:
        return [(m["body"], m["more_body"]) for m in self.sent if m["type"] == "http.response.body"]


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_a_burst_is_one_write_and_the_last_closes_the_answer():
    step = None

    async def pieces():
        yield b"data: 1\n\n"
        yield b"data: 2\n\n"
        await step.wait()  # the engine's next tokens are not there yet
        yield b"data: 3\n\n"
        yield b"data: [DONE]\n\n"

    async def main() -> Client:
        nonlocal step
        step = asyncio.Event()
        client = Client()
        answer = asyncio.create_task(
            EventStream(pieces(), media_type="text/event-stream")(SCOPE, client.receive, client.send)
        )
        for _ in range(5):
            await asyncio.sleep(0)
        assert client.bodies() == [(b"data: 1\n\ndata: 2\n\n", True)]  # sent before the generator goes on
        step.set()
        await answer
        return client

    client = run(main())
    start = client.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert client.bodies() == [(b"data: 1\n\ndata: 2\n\n", True), (b"data: 3\n\ndata: [DONE]\n\n", False)]


def test_an_error_sends_what_was_made_and_leaves_the_answer_unfinished():
    async def pieces():
        yield b"data: 1\n\n"
        raise RuntimeError("the engine broke")

    async def main() -> Client:
        client = Client()
        with pytest.raises(RuntimeError, match="the engine broke"):
            await EventStream(pieces(), media_type="text/event-stream")(SCOPE, client.receive, client.send)
        return client

    assert run(main()).bodies() == [(b"data: 1\n\n", True)]  # no closing message: the server drops the connection


def test_a_hang_up_cancels_the_generator():
    closed = []

    async def pieces():
        try:
            yield b"data: 1\n\n"
            await asyncio.Event().wait()  # a generation that would never end
        finally:
            closed.append(True)

    async def main() -> Client:
        client = Client()
        answer = asyncio.create_task(
            EventStream(pieces(), media_type="text/event-stream")(SCOPE, client.receive, client.send)
        )
        for _ in range(5):
            await asyncio.sleep(0)
        client.gone.set()
        await answer  # returns: nobody is left to answer
        return client

    client = run(main())
    assert closed == [True]
    assert client.bodies() == [(b"data: 1\n\n", True)]


def test_an_empty_stream_still_closes_the_answer():
    async def pieces():
        return
        yield b""

    async def main() -> Client:
        client = Client()
        await EventStream(pieces(), media_type="text/event-stream")(SCOPE, client.receive, client.send)
        return client

    assert run(main()).bodies() == [(b"", False)]
