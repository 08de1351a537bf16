"""When the embedded engine's step fails, the proxy says so in OpenAI's shape: the completion in
flight gets 503 with Retry-After and nothing is recorded for it. A single fault restarts the
engine (the next call is answered, /health counts the restart); a fault that keeps coming stops
it, and then every later call and /health get 503, never a 500 or a hang.

The server runs in this process (uvicorn on a free port, real SQLite, the real model) so the test
can break the engine's step the way a real fault would: an exception inside the engine thread.
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time

import httpx
import pytest
import uvicorn

from proxy.app import create_app
from proxy.config import load_config


@pytest.fixture
def server(tmp_path):
    db = tmp_path / "areal.db"
    cfg = load_config(overrides=[f"store.url=sqlite:///{db}", "proxy.admission=false"])
    app = create_app(cfg)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 240
    while True:
        assert time.monotonic() < deadline, "server did not become healthy"
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    try:
        yield url, app.state.areal.engine, db
    finally:
        srv.should_exit = True
        thread.join(30)
        sock.close()


def _openai_error(response: httpx.Response) -> dict:
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    return error


BODY = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def test_one_fault_fails_its_request_and_the_engine_restarts(server):
    url, engine, db = server
    assert httpx.post(url + "/v1/chat/completions", json=BODY, timeout=120).status_code == 200
    step = engine._step

    def once(*args, **kwargs):
        engine._step = step  # the next step is healthy again
        raise RuntimeError("injected engine fault")

    engine._step = once
    failed = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=120)
    assert failed.status_code == 503, failed.text
    assert "injected engine fault" in _openai_error(failed)["message"]
    assert failed.headers["retry-after"]

    deadline = time.monotonic() + 30
    while (health := httpx.get(url + "/health", timeout=30)).status_code != 200:  # 503 "restarting" meanwhile
        assert "restarting" in _openai_error(health)["message"], health.text
        assert time.monotonic() < deadline, "the engine did not come back"
        time.sleep(0.1)
    assert health.json()["engine"]["restarts"] == 1
    assert httpx.post(url + "/v1/chat/completions", json=BODY, timeout=120).status_code == 200
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from completions").fetchone()[0] == 2, "only the answered calls"


def test_a_fault_that_keeps_coming_stops_the_engine_with_503s_not_500s(server):
    url, engine, db = server
    body = BODY
    assert httpx.post(url + "/v1/chat/completions", json=body, timeout=120).status_code == 200

    def broken(*args, **kwargs):
        raise RuntimeError("injected engine fault")

    engine._step = broken  # every step raises in the engine thread
    for _ in range(8):  # past the engine's limit of faults a minute
        first = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert first.status_code == 503, first.text
        assert first.headers["retry-after"]
    assert "injected engine fault" in _openai_error(first)["message"]

    health = httpx.get(url + "/health", timeout=30)
    assert health.status_code == 503, health.text
    assert _openai_error(health)["code"] == "engine_unavailable"
    assert health.headers["retry-after"]

    later = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert later.status_code == 503, later.text
    _openai_error(later)

    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from completions").fetchone()[0] == 1, "only the answered call"


def test_a_fault_injected_over_http_is_recovered_from(tmp_path):
    """`proxy.fault_injection` (chaos tests, the soak benchmark): the next step fails, the request in
    it gets a 503, the engine restarts and serves the next one. Off, the route does not exist."""
    from tests.conftest import run_server

    with run_server(tmp_path, f"sqlite:///{tmp_path}/a.db", "--set", "proxy.fault_injection=true") as server:
        assert server.post("/debug/engine-fault").status_code == 200
        failed = httpx.post(server.base_url + "/chat/completions", json=BODY, timeout=120)
        assert failed.status_code == 503 and "injected engine fault" in _openai_error(failed)["message"]
        deadline = time.monotonic() + 30
        while server.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert httpx.post(server.base_url + "/chat/completions", json=BODY, timeout=120).status_code == 200
    with run_server(tmp_path, f"sqlite:///{tmp_path}/b.db") as server:
        assert server.post("/debug/engine-fault").status_code == 404
