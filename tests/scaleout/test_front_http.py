"""The front's HTTP, byte by byte: `areal-proxy front` as a process over a replica of the test's own
(a small app that echoes what reached it and streams on request), talked to over raw sockets where a
client library would smooth over what is tested.

What reaches the replica (method, target as sent, headers minus hop-by-hop ones, the body whole with
its length, however the client framed it); pipelined requests answered in order; `Expect:
100-continue`; a body over the limit refused 413 in OpenAI's shape and never forwarded; a request the
parser refuses, 400; a streamed answer relayed piece by piece as the replica sends it; keep-alive
connections to the replica reused; a replica that stops answering, a 503 that tells the client to
retry.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import cli_process, serve_app

LIMIT = 4096  # the front's request body limit in these tests


def replica_app(seen: list[dict]) -> Starlette:
    state = {"version": 0}

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": state["version"]})

    async def weights(request: Request) -> Response:
        pushed = await request.json()
        await asyncio.sleep(1.0)  # loading takes a while
        state["version"] = pushed["version"]
        seen.append({"weights": pushed})
        return JSONResponse({"version": pushed["version"]})

    async def echo(request: Request) -> Response:
        body = await request.body()
        entry = {
            "method": request.method,
            "target": request.scope["raw_path"].decode()
            + ("?" + request.scope["query_string"].decode() if request.scope["query_string"] else ""),
            "headers": [[k.decode(), v.decode()] for k, v in request.scope["headers"]],
            "body": body.decode(),
            "peer_port": request.scope["client"][1],
        }
        seen.append(entry)
        return JSONResponse(entry, headers={"x-replica-says": "hi"})

    async def stream(request: Request) -> Response:
        gap = float(request.query_params.get("gap", "0.3"))

        async def pieces():
            for i in range(3):
                yield f"data: {i}\n\n".encode()
                await asyncio.sleep(gap)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(pieces(), media_type="text/event-stream")

    async def stall(request: Request) -> Response:
        await asyncio.sleep(30)
        return Response(b"late")

    routes = [Route("/health", health), Route("/stream", stream, methods=["POST"]), Route("/stall", stall)]
    routes.append(Route("/weights", weights, methods=["POST"]))
    routes.append(Route("/{path:path}", echo, methods=["GET", "POST", "PUT", "DELETE"]))
    return Starlette(routes=routes)


@pytest.fixture(scope="module")
def front(tmp_path_factory) -> Iterator[tuple[str, list[dict]]]:
    seen: list[dict] = []
    tmp = tmp_path_factory.mktemp("front-http")
    with serve_app(replica_app(seen), proxy_headers=False) as replica:  # the peer is the front's connection
        args = ["--replicas", replica, "--set", f"proxy.max_request_bytes={LIMIT}", "--set", "front.timeout_s=5"]
        args += ["--set", "front.health_interval_s=60"]  # what the front knows of the replica comes from the requests
        with cli_process(tmp, "front", *args, timeout=60) as (url, _proc, _log):
            yield url, seen


def raw_exchange(url: str, data: bytes, answers: int = 1, timeout: float = 10) -> bytes:
    """Send `data` on one connection; read until `answers` whole answers (by content-length) came back
    or the front closed the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        got = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _complete_answers(got) >= answers:
                break
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def _complete_answers(data: bytes) -> int:
    count, rest = 0, data
    while b"\r\n\r\n" in rest:
        head, rest = rest.split(b"\r\n\r\n", 1)
        if head.startswith(b"HTTP/1.1 100"):
            continue
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
            None,
        )
        if length is None or len(rest) < length:
            return count
        rest = rest[length:]
        count += 1
    return count


def answers_of(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    out, rest = [], data
    while b"\r\n\r\n" in rest:
        head, rest = rest.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower().decode(): v.strip().decode() for k, v in (line.split(b":", 1) for line in lines[1:])
        }
        if status == 100:
            continue
        length = int(headers["content-length"])
        out.append((status, headers, rest[:length]))
        rest = rest[length:]
    return out


def test_a_request_reaches_the_replica_as_sent_minus_hop_by_hop_headers(front):
    url, seen = front
    r = httpx.post(
        f"{url}/v1/chat/completions?x=1&y=%20z",
        content=b'{"a": 1}',
        headers={"Authorization": "Bearer k1", "X-Custom": "v", "Connection": "keep-alive", "TE": "trailers"},
    )
    assert r.status_code == 200 and r.headers["x-replica-says"] == "hi"
    assert r.headers["x-areal-replica"].startswith("http://127.0.0.1:")
    got = r.json()
    assert got["method"] == "POST" and got["target"] == "/v1/chat/completions?x=1&y=%20z" and got["body"] == '{"a": 1}'
    headers = dict(got["headers"])
    assert headers["authorization"] == "Bearer k1" and headers["x-custom"] == "v"
    assert headers["content-length"] == "8" and headers["x-forwarded-for"] == "127.0.0.1"
    assert headers["host"] == url.removeprefix("http://")  # the client's: replicas build URLs to the front
    assert "te" not in headers and "connection" not in headers


def test_a_chunked_upload_arrives_whole_with_its_length(front):
    url, _ = front
    host = url.removeprefix("http://")
    raw = (
        f"POST /v1/upload HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    [(status, _, body)] = answers_of(raw_exchange(url, raw))
    got = json.loads(body)
    assert status == 200 and got["body"] == "hello world"
    headers = dict(got["headers"])
    assert headers["content-length"] == "11" and "transfer-encoding" not in headers


def test_pipelined_requests_are_answered_in_order_on_one_connection(front):
    url, _ = front
    host = url.removeprefix("http://")
    raw = b"".join(f"GET /v1/n/{i} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode() for i in range(5))
    got = answers_of(raw_exchange(url, raw, answers=5))
    assert [json.loads(body)["target"] for _, _, body in got] == [f"/v1/n/{i}" for i in range(5)]


def test_expect_100_continue_is_answered_then_the_body_is_read(front):
    url, _ = front
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/x HTTP/1.1\r\nHost: {host}\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"abcd")
        data = b""
        while _complete_answers(data) < 1:
            data += sock.recv(65536)
    [(status, _, body)] = answers_of(data)
    assert status == 200 and json.loads(body)["body"] == "abcd"
    assert "expect" not in dict(json.loads(body)["headers"])


def test_a_body_over_the_limit_is_refused_413_and_never_forwarded(front):
    url, seen = front
    host = url.removeprefix("http://")
    before = len(seen)
    declared = f"POST /v1/big HTTP/1.1\r\nHost: {host}\r\nContent-Length: {LIMIT + 1}\r\n\r\n".encode()
    [(status, headers, body)] = answers_of(raw_exchange(url, declared))  # refused on the length alone
    assert status == 413 and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and str(LIMIT) in error["message"]
    chunked = f"POST /v1/big HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (LIMIT + 1, b"x" * (LIMIT + 1))  # refused as it grows
    [(status, _, _)] = answers_of(raw_exchange(url, chunked))
    assert status == 413 and len(seen) == before


def test_a_malformed_request_gets_a_400(front):
    url, _ = front
    [(status, headers, body)] = answers_of(raw_exchange(url, b"GET /v1/x HTTP/1.1\r\nBad Header Line\r\n\r\n"))
    assert status == 400 and headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_a_streamed_answer_comes_through_piece_by_piece(front):
    url, _ = front
    arrivals = []
    with httpx.stream("POST", f"{url}/stream?gap=0.5", content=b"{}", timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                arrivals.append((time.monotonic(), line))
    assert [line for _, line in arrivals] == ["data: 0", "data: 1", "data: 2", "data: [DONE]"]
    # each piece arrived when the replica sent it, not all at the end (0.5 s apart there)
    assert arrivals[-1][0] - arrivals[0][0] > 0.5


def test_connections_to_the_replica_are_kept_alive_and_reused(front):
    url, seen = front
    with httpx.Client() as client:
        ports = {client.get(f"{url}/v1/same").json()["peer_port"] for _ in range(20)}
    assert len(ports) == 1  # one request after another: one connection from the front to the replica


def test_a_replica_that_stops_answering_gets_a_503_with_retry_advice(front):
    url, _ = front
    r = httpx.get(f"{url}/stall", timeout=20)  # the front waits front.timeout_s = 5 s for data
    assert r.status_code == 503 and r.headers["x-should-retry"] == "true" and "retry-after" in r.headers
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(f"{url}/health").json()["serving"] == 1  # a timeout does not take it out of rotation


def test_a_head_request_gets_the_head_alone_and_the_connection_goes_on(front):
    url, _ = front
    with httpx.Client(timeout=10) as client:
        r = client.head(f"{url}/v1/x")
        assert r.status_code == 200 and r.content == b"" and int(r.headers["content-length"]) > 0
        assert client.get(f"{url}/v1/after-head").json()["target"] == "/v1/after-head"


def test_an_http_1_0_client_gets_a_stream_ended_by_the_connection_not_chunked(front):
    url, _ = front
    raw = b"POST /stream?gap=0.05 HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}"
    data = raw_exchange(url, raw, answers=99)  # read until the front closes the connection
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
    assert b"connection: close" in head.lower()
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"


def test_a_weight_push_goes_on_when_its_client_hangs_up(front):
    url, seen = front
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"path": "/ckpt/step-7", "version": 7}).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /weights HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)  # the replica is loading: the client gives up
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/health").json()["version"] != 7:  # the front took the replica's answer
        assert time.monotonic() < deadline, "the push was dropped with its client"
        time.sleep(0.1)
