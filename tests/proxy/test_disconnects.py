"""One rule for a client that hangs up, whatever the API, streamed or not, direct or through the
front: its generation is cancelled (the engine stops sampling for it within moments) and nothing
of that turn is recorded. A turn whose generation finished before the hang-up is recorded, as any
answered turn is: a turn is stored if and only if its generation finished.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.conftest import Server, run_server, send_part_of_a_body
from tests.scaleout.conftest import run_front

MAX_TOKENS = 3000
PROMPT = "Write a very long story about the sea."


def body(api: str, stream: bool) -> tuple[str, dict]:
    if api == "chat":
        return "/chat/completions", {
            "model": "m",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "stream": stream,
        }
    if api == "responses":
        return "/responses", {
            "model": "m",
            "input": PROMPT,
            "max_output_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "stream": stream,
        }
    return "/messages", {
        "model": "m",
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": PROMPT}],
        "ignore_eos": True,
        "stream": stream,
    }


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, Server]]:
    tmp = tmp_path_factory.mktemp("disconnects")
    with run_server(tmp, f"sqlite:///{tmp}/areal.db") as proxy, run_front(tmp, [proxy]) as front:
        yield {"direct": proxy, "front": front, "proxy": proxy}


def hang_up(url: str, path: str, payload: dict, stream: bool) -> None:
    """Send the request on a raw socket, wait for the first streamed bytes (or 1.5 s), close."""
    parts = urlsplit(url)
    data = json.dumps(payload).encode()
    head = (
        f"POST {parts.path}{path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as s:
        s.sendall(head.encode() + data)
        if stream:
            assert s.recv(65536), "the stream started"
            time.sleep(0.5)
        else:
            time.sleep(1.5)


def engine_stats(proxy: Server) -> dict:
    return proxy.get("/health").json()["engine"]


@pytest.mark.parametrize("via", ["direct", "front"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_client_that_hangs_up_cancels_its_generation_and_nothing_is_recorded(servers, api, stream, via):
    proxy = servers["proxy"]
    session = proxy.new_session()
    path, payload = body(api, stream)
    before = engine_stats(proxy)["tokens"]
    base = f"{servers[via].url}/sessions/{session['session_id']}/v1"
    hang_up(base, path, payload, stream)
    deadline = time.time() + 20
    while engine_stats(proxy)["running"] or engine_stats(proxy)["waiting"]:
        assert time.time() < deadline, "the engine is still generating for a client that left"
        time.sleep(0.2)
    sampled = engine_stats(proxy)["tokens"] - before
    assert sampled < MAX_TOKENS // 2, f"{sampled} tokens sampled for a client that hung up"
    time.sleep(0.5)
    assert proxy.session(session["session_id"])["num_completions"] == 0, "the cancelled turn was recorded"


def test_the_front_never_forwards_a_body_cut_short(servers):
    front = servers["front"]
    sent = sum(r["requests"] for r in front.get("/health").json()["replicas"])
    send_part_of_a_body(front.url)
    deadline = time.time() + 10
    while "client disconnected before sending the whole body" not in front.log.read_text():
        assert time.time() < deadline, front.log.read_text()[-2000:]
        time.sleep(0.2)
    assert sum(r["requests"] for r in front.get("/health").json()["replicas"]) == sent, "a truncated body went on"


def test_hang_ups_leave_no_error_in_the_server_log(servers):
    """Run after the hang-ups above: a cancelled generation is routine, not an error to log."""
    for name in ("proxy", "front"):
        log = servers[name].log.read_text()
        assert " ERROR " not in log and "never retrieved" not in log, log[-3000:]
