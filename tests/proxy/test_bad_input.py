"""Malformed requests: each gets its documented 4xx in OpenAI's error shape and leaves
the store exactly as it was (no session, no completion, no partial row)."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import send_part_of_a_body, store_counts

USER = [{"role": "user", "content": "hi"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def chat(**fields):
    return {"model": "m", "messages": USER, "max_tokens": 4, **fields}


# (case id, path, raw body or JSON, expected status, expected param)
CASES = [
    ("not-json", "/v1/chat/completions", b"{not json", 400, None),
    ("empty-body", "/v1/chat/completions", b"", 400, None),
    ("array-body", "/v1/chat/completions", [1, 2], 400, None),
    ("no-messages", "/v1/chat/completions", {"model": "m"}, 400, "messages"),
    ("empty-messages", "/v1/chat/completions", chat(messages=[]), 400, "messages"),
    ("messages-not-list", "/v1/chat/completions", chat(messages="hi"), 400, "messages"),
    (
        "unknown-role",
        "/v1/chat/completions",
        chat(messages=[{"role": "wizard", "content": "x"}]),
        400,
        "messages[0].role",
    ),
    (
        "content-number",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": 5}]),
        400,
        "messages[0].content",
    ),
    (
        "image-part",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages[0].content[0].type",
    ),
    ("negative-max-tokens", "/v1/chat/completions", chat(max_tokens=-5), 400, "max_tokens"),
    ("zero-max-completion-tokens", "/v1/chat/completions", chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    ("string-max-tokens", "/v1/chat/completions", chat(max_tokens="10"), 400, "max_tokens"),
    ("temperature-too-high", "/v1/chat/completions", chat(temperature=3.5), 400, "temperature"),
    ("temperature-string", "/v1/chat/completions", chat(temperature="hot"), 400, "temperature"),
    ("top-p-zero", "/v1/chat/completions", chat(top_p=0), 400, "top_p"),
    ("n-zero", "/v1/chat/completions", chat(n=0), 400, "n"),
    ("n-too-large", "/v1/chat/completions", chat(n=1000), 400, "n"),
    ("stream-not-bool", "/v1/chat/completions", chat(stream="yes"), 400, "stream"),
    ("stop-too-many", "/v1/chat/completions", chat(stop=[str(i) for i in range(20)]), 400, "stop"),
    ("stop-empty-string", "/v1/chat/completions", chat(stop=[""]), 400, "stop[0]"),
    ("top-logprobs-without-logprobs", "/v1/chat/completions", chat(top_logprobs=2), 400, "top_logprobs"),
    ("top-logprobs-too-many", "/v1/chat/completions", chat(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    (
        "tool-id-mismatch",
        "/v1/chat/completions",
        chat(
            messages=[
                *USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_other", "content": "x"},
            ]
        ),
        400,
        "messages[2].tool_call_id",
    ),
    (
        "tool-without-call",
        "/v1/chat/completions",
        chat(messages=[*USER, {"role": "tool", "tool_call_id": "call_1", "content": "x"}]),
        400,
        "messages[1].tool_call_id",
    ),
    (
        "tool-call-without-id",
        "/v1/chat/completions",
        chat(messages=[*USER, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]),
        400,
        "messages[1].tool_calls[0].id",
    ),
    (
        "tool-without-name",
        "/v1/chat/completions",
        chat(tools=[{"type": "function", "function": {}}]),
        400,
        "tools[0].function.name",
    ),
    (
        "tool-choice-unknown",
        "/v1/chat/completions",
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
        400,
        "tool_choice",
    ),
    ("required-without-tools", "/v1/chat/completions", chat(tool_choice="required"), 400, "tool_choice"),
    (
        "huge-body",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "x" * (9 * 1024 * 1024)}]),
        413,
        None,
    ),
    ("over-context-max-tokens", "/v1/chat/completions", chat(max_tokens=100_000), 422, "messages"),
    (
        "over-context-prompt",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "word " * 9000}], max_tokens=None),
        422,
        "messages",
    ),
    ("unknown-session", "/sessions/sess_doesnotexist/v1/chat/completions", chat(), 404, "session_id"),
    ("finish-unknown-session", "/sessions/sess_doesnotexist/finish", {"reward": 1.0}, 404, "session_id"),
    ("sessions-metadata-not-object", "/sessions", {"metadata": [1]}, 400, "metadata"),
    ("sessions-unknown-reward-fn", "/sessions", {"reward_fn": "no_such_reward"}, 400, "reward_fn"),
    ("weights-bad-version", "/weights", {"path": "/nonexistent", "version": -1}, 400, "version"),
    ("weights-missing-file", "/weights", {"path": "/nonexistent", "version": 99}, 400, "path"),
    ("unknown-route", "/v1/nothing", {}, 404, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_a_clean_4xx(proxy, case):
    _, path, body, status, param = case
    before = store_counts(proxy.db_url)
    if isinstance(body, bytes):
        r = httpx.post(proxy.url + path, content=body, headers={"content-type": "application/json"}, timeout=120)
    else:
        r = httpx.post(proxy.url + path, json=body, timeout=120)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param
    assert store_counts(proxy.db_url) == before, "a refused request must leave the store unchanged"


def test_finished_session_refuses_calls_and_conflicting_finish(proxy):
    session = proxy.new_session()
    url = session["base_url"] + "/chat/completions"
    assert httpx.post(url, json=chat(), timeout=120).status_code == 200
    first = proxy.post(f"/sessions/{session['session_id']}/finish", json={"reward": 1.0})
    assert first.status_code == 200 and first.json()["status"] == "finished"
    again = proxy.post(f"/sessions/{session['session_id']}/finish", json={"reward": 1.0})
    assert again.status_code == 200 and again.json() == first.json(), "finishing is idempotent"
    before = store_counts(proxy.db_url)
    other = proxy.post(f"/sessions/{session['session_id']}/finish", json={"reward": 0.0})
    assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"
    late = httpx.post(url, json=chat(), timeout=120)
    assert late.status_code == 409
    assert store_counts(proxy.db_url) == before


def test_client_hanging_up_mid_body_is_not_a_server_error(sqlite_proxy):
    """A caller that disconnects before its body arrives (a cancelled agent, a stopped run) is
    logged as such, not as an unhandled error with a traceback, and stores nothing."""
    import time

    before = store_counts(sqlite_proxy.db_url)
    start = len(sqlite_proxy.log.read_text())
    send_part_of_a_body(sqlite_proxy.url)
    deadline = time.time() + 30
    while "disconnected before sending" not in (log := sqlite_proxy.log.read_text()[start:]):
        assert time.time() < deadline, log
        time.sleep(0.2)
    assert "unhandled error" not in log and "Traceback" not in log, log
    assert store_counts(sqlite_proxy.db_url) == before
    assert sqlite_proxy.get("/health").status_code == 200
