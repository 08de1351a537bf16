"""`proxy.engines.http1`, the engine backends' client, against a raw asyncio HTTP/1.1 server on a
free port: answers read whole and as they arrive, kept-alive connections, a reader that leaves
early hanging up on the server, the no-data timeout and an unreachable server."""

from __future__ import annotations

import asyncio

import pytest

from proxy.engines.http1 import UpstreamError, UpstreamPool, host_line, post, streamed_post

HEADERS = b"content-type: application/json\r\n"


class Server:
    """Answers each request with `script(writer)`; counts connections and notes when one hung up."""

    def __init__(self, script) -> None:  # noqa: ANN001
        self.script = script
        self.connections = 0
        self.hung_up = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.lower().split(b"\r\n")
                length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
                await reader.readexactly(length)
                await self.script(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.hung_up.set()
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


async def whole(writer: asyncio.StreamWriter) -> None:
    body = b'{"ok": true}'
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()


async def trickle(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    for i in range(50):
        piece = b"data: %d\n\n" % i
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.sleep(0.02)
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def silent_after_head(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(30)


def test_answers_are_read_whole_on_one_kept_alive_connection() -> None:
    async def main() -> None:
        server = Server(whole)
        async with server as url:
            pool = UpstreamPool(connect_timeout_s=5, keep_alive_s=3)
            for _ in range(3):
                status, body = await post(pool, url, b"/generate", b"{}", host_line(url) + HEADERS, 5)
                assert (status, body) == (200, b'{"ok": true}')
            assert server.connections == 1
            pool.close()

    asyncio.run(main())


def test_a_streamed_answer_arrives_in_pieces_and_a_reader_that_leaves_hangs_up() -> None:
    async def main() -> None:
        server = Server(trickle)
        async with server as url:
            pool = UpstreamPool(connect_timeout_s=5, keep_alive_s=3)
            async with streamed_post(pool, url, b"/generate", b"{}", host_line(url) + HEADERS, 5) as answer:
                assert await answer.status() == 200
                reads = [data async for data in answer.chunks()]
            assert b"".join(reads) == b"".join(b"data: %d\n\n" % i for i in range(50))
            assert len(reads) > 1  # handed over as it came, not at the end
            assert not server.hung_up.is_set()

            async with streamed_post(pool, url, b"/generate", b"{}", host_line(url) + HEADERS, 5) as answer:
                async for _ in answer.chunks():
                    break  # the reader stops after the first piece
            await asyncio.wait_for(server.hung_up.wait(), 5)  # the server saw the connection close
            pool.close()

    asyncio.run(main())


def test_no_data_for_the_timeout_fails_as_a_timeout() -> None:
    async def main() -> None:
        async with Server(silent_after_head) as url:
            pool = UpstreamPool(connect_timeout_s=5, keep_alive_s=3)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(UpstreamError) as failed:
                async with streamed_post(pool, url, b"/generate", b"{}", host_line(url) + HEADERS, 0.5) as answer:
                    assert await answer.status() == 200
                    async for _ in answer.chunks():
                        pass
            assert failed.value.timeout and loop.time() - started < 10
            pool.close()

    asyncio.run(main())


def test_an_unreachable_server_fails_as_unreachable() -> None:
    async def main() -> None:
        async with Server(whole) as url:
            pass  # closed: nothing listens on its port now
        pool = UpstreamPool(connect_timeout_s=5, keep_alive_s=3)
        with pytest.raises(UpstreamError) as failed:
            await post(pool, url, b"/generate", b"{}", host_line(url) + HEADERS, 5)
        assert failed.value.unreachable

    asyncio.run(main())
