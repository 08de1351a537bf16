"""The real `openai` client against a real `areal-proxy serve` with the real model."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.conftest import reuse_after_idle

pytestmark = pytest.mark.agents  # also run on the newest client releases (.ci/run)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SYSTEM = {
    "role": "system",
    "content": "You are a weather assistant. Always call get_weather with the city the user names.",
}


def client_for(proxy, session: dict | None = None) -> openai.OpenAI:
    if session is None:
        return openai.OpenAI(base_url=proxy.base_url, api_key="anything", max_retries=0)
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)


def test_models_lists_a_slash_free_id(proxy):
    models = client_for(proxy).models.list()
    assert [m.id for m in models.data] == ["smollm2-135m-instruct"]
    assert "/" not in models.data[0].id


def test_non_streaming_answer_is_recorded(proxy):
    session = proxy.new_session(task_id="t-basic")
    client = client_for(proxy, session)
    r = client.chat.completions.create(
        model="gpt-5.6-luna", messages=[{"role": "user", "content": "What is 2+3?"}], max_tokens=16, temperature=0
    )
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "gpt-5.6-luna"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    tree = proxy.session(session["session_id"])
    [node] = tree["completions"]
    assert node["id"] == r.id
    assert node["response"]["content"] == choice.message.content
    assert len(node["output_ids"]) == r.usage.completion_tokens == len(node["output_logprobs"])
    assert node["output_versions"] == [0] * len(node["output_ids"])
    assert len(node["prompt_ids"]) == r.usage.prompt_tokens


def test_streaming_text_with_usage_and_done(proxy):
    session = proxy.new_session()
    client = client_for(proxy, session)
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Count from one to five."}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert len(pieces) > 3, "tokens must arrive as separate chunks"
    assert usage is not None and usage.completion_tokens >= len(pieces) - 1
    assert finish in ("stop", "length")
    [node] = proxy.session(session["session_id"])["completions"]
    assert node["response"]["content"] == "".join(pieces)


def test_stream_is_event_stream_even_with_json_accept(proxy):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    with httpx.stream(
        "POST", proxy.base_url + "/chat/completions", json=body, headers={"accept": "application/json"}, timeout=120
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in lines[:-1]]
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] >= 1


def test_n_choices_are_separate_nodes(proxy):
    session = proxy.new_session()
    client = client_for(proxy, session)
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Name a colour."}], n=3, max_tokens=8, seed=7
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    nodes = proxy.session(session["session_id"])["completions"]
    assert len(nodes) == 3
    assert {n["response_id"] for n in nodes} == {r.id}
    assert sorted(n["choice_index"] for n in nodes) == [0, 1, 2]
    assert all(n["parent_id"] is None for n in nodes)


def test_seed_makes_sampling_reproducible(proxy):
    client = client_for(proxy)
    messages = [{"role": "user", "content": "Tell me a word."}]
    a = client.chat.completions.create(model="m", messages=messages, max_tokens=12, seed=42, temperature=1.0)
    b = client.chat.completions.create(model="m", messages=messages, max_tokens=12, seed=42, temperature=1.0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_stop_sequence_trims_content(proxy):
    client = client_for(proxy)
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6"}],
        max_tokens=40,
        temperature=0,
        stop=[","],
    )
    assert "," not in (r.choices[0].message.content or "")
    assert r.choices[0].finish_reason == "stop"


def test_logprobs_in_openai_shape(proxy):
    client = client_for(proxy)
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Say yes."}],
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
        temperature=0,
    )
    content = r.choices[0].logprobs.content
    assert content and all(isinstance(e.token, str) and e.logprob <= 0 for e in content)
    assert all(len(e.top_logprobs) == 3 for e in content)
    assert all(e.top_logprobs[0].logprob >= e.logprob - 1e-5 for e in content)


def test_named_tool_choice_returns_a_tool_call(proxy):
    session = proxy.new_session()
    client = client_for(proxy, session)
    r = client.chat.completions.create(
        model="m",
        messages=[SYSTEM, {"role": "user", "content": "What's the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice=NAMED,
        max_tokens=40,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)
    [node] = proxy.session(session["session_id"])["completions"]
    assert node["response"]["tool_calls"][0]["id"] == call.id


def test_streamed_tool_call_deltas(proxy):
    client = client_for(proxy)
    stream = client.chat.completions.create(
        model="m",
        messages=[SYSTEM, {"role": "user", "content": "What's the weather in Rome?"}],
        tools=[WEATHER],
        tool_choice=NAMED,
        max_tokens=40,
        temperature=0,
        stream=True,
    )
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                entry["id"] = d.id or entry["id"]
                if d.function and d.function.name:
                    entry["name"] = d.function.name
                if d.function and d.function.arguments:
                    entry["arguments"] += d.function.arguments
                if d.type:
                    assert d.type == "function"
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert "city" in json.loads(calls[0]["arguments"])


def test_malformed_tool_output_is_plain_content(proxy):
    """A forced call the model cannot complete validly is returned as text, never a 500."""
    client = client_for(proxy)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hello"}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        max_tokens=3,
    )
    choice = r.choices[0]
    assert choice.message.tool_calls is None
    assert choice.message.content.startswith("<tool_call>")
    assert choice.finish_reason == "length"


def test_health_and_metrics(proxy):
    health = httpx.get(proxy.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["version"] == 0
    metrics = httpx.get(proxy.url + "/metrics", timeout=10).text
    assert "areal_requests_total" in metrics


@pytest.mark.parametrize("path", ["/sessions/{sid}/v1", "bearer"])
def test_session_by_path_or_key(proxy, path):
    session = proxy.new_session()
    if path == "bearer":
        client = openai.OpenAI(base_url=proxy.base_url, api_key=session["api_key"], max_retries=0)
    else:
        client = openai.OpenAI(base_url=proxy.url + path.format(sid=session["session_id"]), api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert len(proxy.session(session["session_id"])["completions"]) == 1


def test_an_idle_kept_alive_connection_is_still_served_after_6_s(sqlite_proxy):
    reuse_after_idle(sqlite_proxy.url, idle_s=6.0)
