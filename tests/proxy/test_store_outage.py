"""A store outage under a running server: model calls answer 503 + Retry-After in their API's shape
within the `[store]` timeouts (not a hang), a stream that cannot be recorded ends with an error
event, `/health` still answers, and once PostgreSQL is back the same server records calls again;
every call answered 200 is stored, once.

A real `areal-proxy serve` reaches the machine's PostgreSQL through `Relay`, which the test cuts
(`down`: connections closed, new ones refused; `partition`: everything silent) and restores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from tests.conftest import Server, fresh_pg_database, run_server
from tests.store.relay import Relay

TIMEOUTS = ("--set", "store.connect_timeout_s=2", "--set", "store.statement_timeout_s=2")
BOUND_S = 35.0
"""Well over what those timeouts allow a failing call (at most about 6 s, twice if the calls fall in two
group commits, plus generating its reply), under the client's 60 s."""
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Relay]]:
    tmp = tmp_path_factory.mktemp("store-outage")
    with fresh_pg_database() as url, Relay(url) as relay, run_server(tmp, relay.url, *TIMEOUTS) as server:
        yield server, relay


def post(server: Server, path: str, body: dict) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(server.url + path, json=body, timeout=60)
    return response, time.monotonic() - started


def chat(messages: list[dict] = HI, **extra) -> dict:
    return {"model": "m", "messages": messages, "max_tokens": 4, **extra}


def stream(server: Server, path: str, body: dict) -> tuple[int, str, list[bytes], float]:
    """(status, x-request-id or request-id, SSE events, seconds) of a streamed call."""
    started = time.monotonic()
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as response:
        request_id = response.headers.get("x-request-id") or response.headers.get("request-id", "")
        events = [e for e in response.read().split(b"\n\n") if e.strip()]
    return response.status_code, request_id, events, time.monotonic() - started


def assert_unavailable_openai(response: httpx.Response, seconds: float) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) > 0
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "store_unavailable"
    assert seconds < BOUND_S


def calls_during_the_outage(server: Server, base: str, session: str) -> None:
    # recorded at the end: the commit fails
    response, seconds = post(server, f"{base}/chat/completions", chat())
    assert_unavailable_openai(response, seconds)
    # a conversation whose parent is looked up first: the read fails
    history = [*HI, {"role": "assistant", "content": "never recorded"}, {"role": "user", "content": "Again"}]
    response, seconds = post(server, f"{base}/chat/completions", chat(history))
    assert_unavailable_openai(response, seconds)
    # several at once, sharing group commits
    with ThreadPoolExecutor(4) as pool:
        calls = list(pool.map(lambda _: post(server, f"{base}/chat/completions", chat()), range(4)))
    for response, seconds in calls:
        assert_unavailable_openai(response, seconds)
    # a control read
    started = time.monotonic()
    response = httpx.get(server.url + f"/sessions/{session}", timeout=60)
    assert_unavailable_openai(response, time.monotonic() - started)
    # Anthropic's shape on the Messages route
    response, seconds = post(server, f"{base}/messages", {"model": "m", "max_tokens": 4, "messages": HI})
    assert response.status_code == 503 and response.headers["retry-after"], response.text
    message = response.json()["error"]["message"]
    assert response.json() == {"type": "error", "error": {"type": "overloaded_error", "message": message}}
    assert seconds < BOUND_S
    # streams end with an error event in their API's shape
    status, _, events, seconds = stream(server, f"{base}/chat/completions", chat(stream=True))
    assert status == 200 and seconds < BOUND_S
    assert orjson.loads(events[-1].removeprefix(b"data: "))["error"]["code"] == "store_unavailable"
    assert b"data: [DONE]" not in events
    body = {"model": "m", "max_tokens": 4, "messages": HI, "stream": True}
    status, _, events, seconds = stream(server, f"{base}/messages", body)
    assert status == 200 and seconds < BOUND_S
    kind, data = events[-1].split(b"\n", 1)
    assert kind == b"event: error"
    assert orjson.loads(data.removeprefix(b"data: "))["error"]["type"] == "overloaded_error"
    # the server itself is fine
    started = time.monotonic()
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200
    assert time.monotonic() - started < 10  # milliseconds when the server is fine


@pytest.mark.parametrize("fault", ["down", "partition"])
def test_calls_fail_fast_while_the_store_is_out_and_resume_after(outage, fault):
    server, relay = outage
    session = server.new_session(task_id=f"outage-{fault}")["session_id"]
    base = f"/sessions/{session}/v1"
    answered = []
    for _ in range(2):
        response, _ = post(server, f"{base}/chat/completions", chat())
        assert response.status_code == 200, response.text
        answered.append(response.json()["id"])

    getattr(relay, fault)()
    try:
        calls_during_the_outage(server, base, session)
    finally:
        relay.restore()

    response, _ = post(server, f"{base}/chat/completions", chat())  # the very next call
    assert response.status_code == 200, response.text
    answered.append(response.json()["id"])
    status, streamed, events, _ = stream(server, f"{base}/chat/completions", chat(stream=True))
    assert status == 200 and events[-1] == b"data: [DONE]"
    answered.append(streamed)

    recorded = server.session(session)  # none of the calls answered 503 or cut by an error event
    assert sorted(c["id"] for c in recorded["completions"]) == sorted(answered)
    assert recorded["num_completions"] == len(answered)
