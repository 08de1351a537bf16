"""Messages API request shapes captured from real clients, sent as captured to a real server.

Each fixture in `fixtures/messages_shapes/` is one request the Claude Code CLI (run by the Claude
Agent SDK, its bundled CLI pointed at a capturing HTTP server) or the `anthropic` SDK sent: path
and query (`?beta=true`), the anthropic-version / anthropic-beta headers and the body, byte for
byte, with what the proxy answers. docs/frameworks.md lists the same table; the test holds the
two to each other. The server caps every Messages reply at 48 tokens
(`[proxy] messages_max_tokens_cap`), which Claude Code's `max_tokens` of 32000–128000 needs on a
CPU; the clamp to the context itself and the `refuse` setting have their own tests here.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_server

FIXTURES = Path(__file__).parent / "fixtures" / "messages_shapes"
SHAPES = sorted(p.stem for p in FIXTURES.glob("*.json"))
DOC = Path(__file__).parents[2] / "docs" / "frameworks.md"
CAP = 48
CONTEXT = 512
TEMPLATES = Path(__file__).parents[1] / "parsers" / "templates"
ASK = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shapes")
    with run_server(tmp, f"sqlite:///{tmp}/areal.db", "--set", f"proxy.messages_max_tokens_cap={CAP}") as server:
        yield server


@pytest.fixture(scope="module")
def short_context(tmp_path_factory):
    """A server whose context `engine.context_length` cuts to CONTEXT tokens: filling it takes seconds
    on a CPU, where the model's own 8,192 took a minute."""
    tmp = tmp_path_factory.mktemp("short")
    args = ("--set", f"proxy.messages_max_tokens_cap={CAP}", "--set", f"engine.context_length={CONTEXT}")
    with run_server(tmp, f"sqlite:///{tmp}/areal.db", *args) as server:
        yield server


@pytest.fixture(scope="module")
def refusing_thinker(tmp_path_factory):
    """A second server: Qwen3's thinking template (the generation prompt opens `<think>`) and
    `messages_max_tokens = "refuse"`."""
    tmp = tmp_path_factory.mktemp("thinker")
    template = f"engine.chat_template={TEMPLATES / 'qwen3_thinking.jinja'}"
    args = ("--set", template, "--set", "proxy.messages_max_tokens=refuse")
    with run_server(tmp, f"sqlite:///{tmp}/areal.db", *args) as server:
        yield server


def sse_events(text: str) -> list[dict]:
    events = []
    for chunk in text.strip().split("\n\n"):
        kind, data = chunk.split("\n", 1)
        assert kind.startswith("event: ") and data.startswith("data: "), chunk
        event = json.loads(data[len("data: ") :])
        assert event["type"] == kind[len("event: ") :]
        events.append(event)
    return events


def answer(response: httpx.Response, streamed: bool) -> dict:
    """The message a response carries, rebuilt from its events when streamed."""
    if not streamed:
        assert response.headers["content-type"].startswith("application/json")
        return response.json()
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    assert "error" not in kinds
    message = events[0]["message"]
    blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop")
    return {**message, **events[-2]["delta"], "content": [{"type": t} for t in blocks], "usage": events[-2]["usage"]}


def test_at_least_25_shapes_from_both_clients():
    assert len(SHAPES) >= 25
    clients = {json.loads((FIXTURES / f"{name}.json").read_text())["client"].split()[0] for name in SHAPES}
    assert clients == {"claude-agent-sdk", "anthropic"}


@pytest.mark.parametrize("name", SHAPES)
def test_a_captured_request_is_answered_as_documented(capped, name):
    shape = json.loads((FIXTURES / f"{name}.json").read_text())
    expect = shape["expect"]
    url = capped.url + shape["path"] + (f"?{shape['query']}" if shape["query"] else "")
    headers = {**shape["headers"], "x-api-key": "sk-anything"}
    r = httpx.post(url, content=json.dumps(shape["body"]), headers=headers, timeout=300)
    assert r.status_code == expect["status"], r.text
    if expect["status"] != 200:
        error = r.json()
        assert error["type"] == "error" and error["error"]["type"] == expect["error_type"]
        assert expect["message"] in error["error"]["message"]
        return
    if "input_tokens" in expect:
        assert r.json()["input_tokens"] > 10
        return
    message = answer(r, bool(shape["body"].get("stream")))
    assert message["stop_reason"] in expect["stop_reason"]
    assert 1 <= message["usage"]["output_tokens"] <= CAP
    kinds = [block["type"] for block in message["content"]]
    assert ("tool_use" in kinds) == (message["stop_reason"] == "tool_use"), kinds
    assert r.headers["request-id"].startswith("msg_")


CLAUDE_CODE = {  # what the Claude Code CLI adds to every call (tests/proxy/fixtures/messages_shapes/cc_*)
    "thinking": {"type": "adaptive", "display": "updates"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "medium"},
    "metadata": {"user_id": '{"device_id":"d","account_uuid":"","session_id":"s"}'},
    "max_tokens": 128000,
    "stream": True,
}
CLAUDE_CODE_HEADERS = {"anthropic-beta": "claude-code-20250219,context-management-2025-06-27,effort-2025-11-24"}


def claude_code_turn(proxy, session: dict, messages: list, tools: list) -> dict:
    """One call shaped as the Claude Code CLI sends it, its reply rebuilt from the stream."""
    body = {**CLAUDE_CODE, "model": "claude-opus-5-5", "messages": messages, "tools": tools, "max_tokens": 128000}
    body["system"] = [{"type": "text", "text": "You are a calculator.", "cache_control": {"type": "ephemeral"}}]
    body["tool_choice"] = {"type": "any"} if messages[-1]["role"] == "system" else {"type": "auto"}
    url = f"{proxy.url}/sessions/{session['session_id']}/v1/messages?beta=true"
    r = httpx.post(url, json=body, headers={**CLAUDE_CODE_HEADERS, "x-api-key": session["api_key"]}, timeout=600)
    assert r.status_code == 200, r.text
    events = [json.loads(line[len("data: ") :]) for line in r.text.splitlines() if line.startswith("data: ")]
    blocks = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    for e in events:
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            blocks[e["index"]]["text"] += e["delta"]["text"]
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            blocks[e["index"]]["input"] = json.loads(e["delta"]["partial_json"])
    return {"id": events[0]["message"]["id"], "stop_reason": events[-2]["delta"]["stop_reason"], "content": blocks}


def test_a_claude_code_conversation_is_one_token_exact_chain(capped):
    """Claude Code's calls: a system entry after the first user turn (kept in place on every later
    call), thinking, effort, context management, cache_control, max_tokens far past the context
    (clamped), `?beta=true`. Each call continues the one before it token for token."""
    proxy = capped
    session = proxy.new_session(seed=1)  # the same samples every run
    add = {
        "name": "mcp__calc__add",
        "description": "Add two integers",
        "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        "cache_control": {"type": "ephemeral"},
    }
    context = {"role": "system", "content": [{"type": "text", "text": "Today's date is 2026-12-05."}]}
    messages: list = [{"role": "user", "content": "What is 2+3?"}, context]
    first = claude_code_turn(proxy, session, messages, [add])
    assert first["stop_reason"] == "tool_use", first
    [call] = [b for b in first["content"] if b["type"] == "tool_use"]
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "5"}]}
    messages += [
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": [{**result, "cache_control": {"type": "ephemeral"}}]},
    ]
    second = claude_code_turn(proxy, session, messages, [add])
    messages += [{"role": "assistant", "content": second["content"]}, {"role": "user", "content": "And 4+4?"}]
    third = claude_code_turn(proxy, session, messages, [add])
    ids = [first["id"], second["id"], third["id"]]
    nodes = nodes_of(proxy, session)
    assert [nodes[i]["parent_id"] for i in ids] == [None, first["id"], second["id"]]
    assert_extends(nodes[first["id"]], nodes[second["id"]])
    assert_extends(nodes[second["id"]], nodes[third["id"]])
    assert nodes[third["id"]]["messages"][:3] == [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "system", "content": "Today's date is 2026-12-05."},
    ]


def test_max_tokens_past_the_context_is_served_up_to_it(short_context):
    """Clamped: a prompt that leaves fewer tokens than the cap is answered up to the context's last
    token, stop_reason max_tokens. The context is `engine.context_length`'s, well inside the model's
    8,192 tokens: a prompt past it is refused."""

    def prompt_tokens(n: int) -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": "one " * n}]}
        r = httpx.post(short_context.url + "/v1/messages/count_tokens", json=body, timeout=120)
        return r.json()["input_tokens"]

    base, per_word = prompt_tokens(100), (prompt_tokens(200) - prompt_tokens(100)) / 100
    words = 100 + int((CONTEXT - 20 - base) / per_word)
    body = {"model": "m", "max_tokens": 32000, "ignore_eos": True}
    r = httpx.post(
        short_context.url + "/v1/messages",
        json={**body, "messages": [{"role": "user", "content": "one " * words}]},
        timeout=600,
    )
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert CONTEXT - CAP < usage["input_tokens"] < CONTEXT, usage
    assert usage["output_tokens"] == CONTEXT - usage["input_tokens"] and r.json()["stop_reason"] == "max_tokens"

    r = httpx.post(
        short_context.url + "/v1/messages",
        json={**body, "messages": [{"role": "user", "content": "one " * (words + 100)}]},
        timeout=600,
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert f"context of {CONTEXT} tokens" in r.json()["error"]["message"]


def test_max_tokens_past_the_context_is_refused_when_configured(refusing_thinker):
    r = httpx.post(refusing_thinker.url + "/v1/messages", json={"model": "m", "max_tokens": 32000, "messages": ASK})
    assert r.status_code == 422
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "max_tokens 32000" in error["error"]["message"]


def test_thinking_disabled_opens_the_reply_with_an_empty_reasoning_block(refusing_thinker):
    """Adaptive (or absent), the reply starts inside the template's `<think>` block: reasoning.
    Disabled, the prompt closes the block first, so the whole reply is text."""
    url = refusing_thinker.url + "/v1/messages"
    replies = {}
    for kind in ("adaptive", "disabled"):
        body = {"model": "m", "max_tokens": 12, "temperature": 0, "messages": ASK, "thinking": {"type": kind}}
        r = httpx.post(url, json=body, timeout=300)
        assert r.status_code == 200, r.text
        replies[kind] = r.json()
    assert [b["type"] for b in replies["adaptive"]["content"]][0] == "thinking"
    assert "thinking" not in [b["type"] for b in replies["disabled"]["content"]]
    closing = replies["disabled"]["usage"]["input_tokens"] - replies["adaptive"]["usage"]["input_tokens"]
    assert closing >= 2  # "</think>" and the blank line after it


def nodes_of(proxy, session: dict) -> dict[str, dict]:
    return {n["id"]: n for n in proxy.session(session["session_id"])["completions"]}


def assert_extends(parent: dict, child: dict) -> None:
    parent_full = parent["prompt_ids"] + parent["output_ids"]
    assert (child["prompt_ids"] + child["output_ids"])[: len(parent_full)] == parent_full


def test_the_docs_table_lists_every_shape_with_its_status():
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[0].strip("`") in SHAPES:
            rows[cells[0].strip("`")] = cells[-1]
    assert sorted(rows) == SHAPES
    for name, outcome in rows.items():
        expect = json.loads((FIXTURES / f"{name}.json").read_text())["expect"]
        assert outcome.startswith(str(expect["status"])), (name, outcome)
