"""The real `anthropic` client's Messages API against a real `areal-proxy serve` with the real model.

The anthropic client appends `/v1/messages` to its base URL, so a session's base URL
is the proxy root plus `/sessions/{id}`; its key travels as `x-api-key`.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

pytestmark = pytest.mark.agents  # also run on the newest anthropic release (.ci/run)

SYSTEM = "You are a weather assistant. Always call get_weather with the city the user names."
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
NAMED = {"type": "tool", "name": "get_weather"}
GREEDY = {"temperature": 0}  # this client version has no sampling arguments; the proxy still reads them


def client_for(proxy, session: dict, by_path: bool = True) -> anthropic.Anthropic:
    base = f"{proxy.url}/sessions/{session['session_id']}" if by_path else proxy.url
    return anthropic.Anthropic(base_url=base, api_key=session["api_key"], max_retries=0)


def nodes_of(proxy, session: dict) -> dict[str, dict]:
    return {n["id"]: n for n in proxy.session(session["session_id"])["completions"]}


def assert_extends(parent: dict, child: dict) -> None:
    parent_full = parent["prompt_ids"] + parent["output_ids"]
    child_full = child["prompt_ids"] + child["output_ids"]
    assert child_full[: len(parent_full)] == parent_full, "the child must continue its parent's exact tokens"


@pytest.mark.parametrize("by_path", [True, False])
def test_text_message_is_recorded(proxy, by_path):
    session = proxy.new_session()
    r = client_for(proxy, session, by_path).messages.create(
        model="claude-sonnet-4-5",
        system=[{"type": "text", "text": "Answer briefly."}],
        messages=[{"role": "user", "content": "What is 2+3?"}],
        max_tokens=12,
        extra_body=GREEDY,
    )
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant"
    assert r.model == "claude-sonnet-4-5"
    [block] = r.content
    assert block.type == "text" and block.text
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert r.usage.output_tokens >= 1 and r.usage.input_tokens > 5
    [node] = nodes_of(proxy, session).values()
    assert node["id"] == r.id and node["api"] == "messages"
    assert node["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    assert node["response"]["content"] == block.text
    assert len(node["output_ids"]) == r.usage.output_tokens and len(node["prompt_ids"]) == r.usage.input_tokens


def test_streamed_text(proxy):
    session = proxy.new_session()
    client = client_for(proxy, session)
    with client.messages.stream(
        model="m", messages=[{"role": "user", "content": "Count from one to five."}], max_tokens=20, extra_body=GREEDY
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 3, "tokens must arrive as separate events"
    assert final.content[0].text == "".join(pieces)
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens >= 1
    [node] = nodes_of(proxy, session).values()
    assert node["id"] == final.id and node["response"]["content"] == "".join(pieces)


def test_raw_stream_event_sequence(proxy):
    session = proxy.new_session()
    events = list(
        client_for(proxy, session).messages.create(
            model="m",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            stream=True,
            extra_body=GREEDY,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0].message.usage.input_tokens > 0 and events[-2].usage.output_tokens >= 1


def test_forced_tool_use(proxy):
    session = proxy.new_session()
    r = client_for(proxy, session).messages.create(
        model="m",
        system=SYSTEM,
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice=NAMED,
        max_tokens=24,
        extra_body=GREEDY,
    )
    assert r.stop_reason == "tool_use"
    [block] = r.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.id.startswith("call_")
    assert isinstance(block.input, dict) and "city" in block.input
    [node] = nodes_of(proxy, session).values()
    call = node["response"]["tool_calls"][0]
    assert call["id"] == block.id and json.loads(call["function"]["arguments"]) == block.input


def test_streamed_tool_use(proxy):
    session = proxy.new_session()
    with client_for(proxy, session).messages.stream(
        model="m",
        system=SYSTEM,
        messages=[{"role": "user", "content": "What's the weather in Rome?"}],
        tools=[WEATHER],
        tool_choice={"type": "any"},
        max_tokens=24,
        extra_body=GREEDY,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds and "text" not in kinds
    assert final.stop_reason == "tool_use"
    [block] = final.content
    assert block.type == "tool_use" and "city" in block.input


def test_tool_result_turns_are_token_exact(proxy):
    session = proxy.new_session()
    client = client_for(proxy, session)
    messages: list = [{"role": "user", "content": "What's the weather in Paris?"}]
    common = {"model": "m", "system": SYSTEM, "tools": [WEATHER]}
    first = client.messages.create(**common, messages=messages, tool_choice=NAMED, max_tokens=24, extra_body=GREEDY)
    [call] = first.content
    assert call.type == "tool_use", first.content
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 degrees"}]},
    ]
    second = client.messages.create(**common, messages=messages, max_tokens=16)
    messages += [
        {"role": "assistant", "content": second.content},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
    ]
    with client.messages.stream(**common, messages=messages, max_tokens=16) as stream:
        third = stream.get_final_message()
    ids = [first.id, second.id, third.id]
    nodes = nodes_of(proxy, session)
    assert [nodes[i]["parent_id"] for i in ids] == [None, first.id, second.id]
    assert_extends(nodes[first.id], nodes[second.id])
    assert_extends(nodes[second.id], nodes[third.id])
    assert nodes[second.id]["messages"][-1] == {
        "role": "tool",
        "content": "Sunny, 21 degrees",
        "tool_call_id": call.id,
    }


def test_stop_sequence(proxy):
    session = proxy.new_session()
    r = client_for(proxy, session).messages.create(
        model="m",
        messages=[{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6"}],
        max_tokens=40,
        stop_sequences=[","],
        extra_body=GREEDY,
    )
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == ","
    assert "," not in r.content[0].text


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 400),  # max_tokens is required
        ({"model": "m", "max_tokens": 4, "messages": []}, 400),
        ({"model": "m", "max_tokens": 4, "messages": [{"role": "tool", "content": "hi"}]}, 400),
        ({"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": [{"type": "image"}]}]}, 400),
        (
            {
                "model": "m",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": ""}]}],
            },
            400,
        ),
        ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400),
        ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "temperature": 3}, 400),
        (
            {
                "model": "m",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [WEATHER],
                "tool_choice": {"type": "tool", "name": "nope"},
            },
            400,
        ),
        ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [{}]}, 400),
    ],
)
def test_errors_in_anthropic_shape(proxy, body, status):
    r = httpx.post(proxy.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == status, r.text
    payload = r.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "invalid_request_error" and payload["error"]["message"]


def test_client_raises_typed_errors(proxy):
    session = proxy.new_session()
    client = client_for(proxy, session)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model="m",
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "?"}]}],
        )
    assert err.value.body["error"]["type"] == "invalid_request_error"
    missing = anthropic.Anthropic(base_url=f"{proxy.url}/sessions/sess_nope", api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as err:
        missing.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["error"]["type"] == "not_found_error"
