"""The real `openai` client's Responses API against a real `areal-proxy serve` with the real model."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.agents  # also run on the newest client releases (.ci/run)

INSTRUCTIONS = "You are a weather assistant. Always call get_weather with the city the user names."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
NAMED = {"type": "function", "name": "get_weather"}


def client_for(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)


def nodes_of(proxy, session: dict) -> dict[str, dict]:
    return {n["id"]: n for n in proxy.session(session["session_id"])["completions"]}


def assert_extends(parent: dict, child: dict) -> None:
    parent_full = parent["prompt_ids"] + parent["output_ids"]
    child_full = child["prompt_ids"] + child["output_ids"]
    assert child_full[: len(parent_full)] == parent_full, "the child must continue its parent's exact tokens"


def test_text_response_is_recorded(proxy):
    session = proxy.new_session()
    r = client_for(session).responses.create(
        model="gpt-5.6-luna", instructions="Answer briefly.", input="What is 2+3?", max_output_tokens=12, temperature=0
    )
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.model == "gpt-5.6-luna"
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert item.content[0].type == "output_text" and item.content[0].annotations == []
    assert r.output_text == item.content[0].text
    u = r.usage
    assert u.output_tokens >= 1 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens == 0 and u.output_tokens_details.reasoning_tokens == 0
    [node] = nodes_of(proxy, session).values()
    assert node["id"] == r.id and node["api"] == "responses"
    assert node["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    assert node["response"]["content"] == r.output_text
    assert len(node["output_ids"]) == u.output_tokens and len(node["prompt_ids"]) == u.input_tokens


def test_streamed_events_in_order(proxy):
    session = proxy.new_session()
    stream = client_for(session).responses.create(
        model="m",
        input=[{"role": "user", "content": "Count from one to five."}],
        max_output_tokens=20,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 3, "tokens must arrive as separate events"
    final = events[-1].response
    assert final.status == "completed" and final.output_text == "".join(deltas)
    assert final.usage.output_tokens >= 1
    [node] = nodes_of(proxy, session).values()
    assert node["id"] == final.id and node["response"]["content"] == final.output_text


def test_named_tool_choice_returns_a_function_call(proxy):
    session = proxy.new_session()
    r = client_for(session).responses.create(
        model="m",
        instructions=INSTRUCTIONS,
        input="What's the weather in Paris?",
        tools=[WEATHER],
        tool_choice=NAMED,
        max_output_tokens=24,
        temperature=0,
    )
    [call] = r.output
    assert call.type == "function_call" and call.status == "completed" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert "city" in json.loads(call.arguments)
    assert r.tool_choice.name == "get_weather" and r.tools[0].name == "get_weather"
    [node] = nodes_of(proxy, session).values()
    assert node["response"]["tool_calls"][0]["id"] == call.call_id
    assert node["response"]["tool_calls"][0]["function"]["arguments"] == call.arguments


def test_streamed_function_call_events(proxy):
    session = proxy.new_session()
    stream = client_for(session).responses.create(
        model="m",
        instructions=INSTRUCTIONS,
        input="What's the weather in Rome?",
        tools=[WEATHER],
        tool_choice=NAMED,
        max_output_tokens=24,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds
    assert kinds[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-2].item
    assert done.type == "function_call" and done.call_id.startswith("call_")
    assert events[-3].arguments == done.arguments == events[-1].response.output[0].arguments


def test_history_resent_as_items_continues_token_exactly(proxy):
    """The Agents SDK way: every turn resends all items, with the ids the proxy gave out."""
    session = proxy.new_session()
    client = client_for(session)
    items: list = [{"role": "user", "content": "What's the weather in Paris?"}]
    common = {"model": "m", "instructions": INSTRUCTIONS, "tools": [WEATHER]}
    first = client.responses.create(**common, input=items, tool_choice=NAMED, max_output_tokens=24, temperature=0)
    [call] = first.output
    assert call.type == "function_call", first.output
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 degrees"})
    second = client.responses.create(**common, input=items, max_output_tokens=16)
    items += [o.model_dump(exclude_none=True) for o in second.output]
    items.append({"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]})
    third = client.responses.create(**common, input=items, max_output_tokens=16, stream=True)
    final = [e for e in third if e.type == "response.completed"][0].response
    ids = [first.id, second.id, final.id]
    nodes = nodes_of(proxy, session)
    assert [nodes[i]["parent_id"] for i in ids] == [None, first.id, second.id]
    assert [nodes[i]["depth"] for i in ids] == [0, 1, 2]
    assert_extends(nodes[first.id], nodes[second.id])
    assert_extends(nodes[second.id], nodes[final.id])
    assert nodes[second.id]["messages"][-1] == {
        "role": "tool",
        "content": "Sunny, 21 degrees",
        "tool_call_id": call.call_id,
    }


def test_message_and_function_call_items_merge_into_one_turn(proxy):
    """Text followed by calls is one assistant message: an item-by-item replay would not hash to it."""
    session = proxy.new_session()
    client = client_for(session)
    first = client.responses.create(model="m", instructions=INSTRUCTIONS, input="Weather in Oslo?", max_output_tokens=8)
    # Replay the turn as if it had been a text + call reply, which a fresh reply cannot have been: new root.
    fake_call = {"type": "function_call", "call_id": "call_x", "name": "get_weather", "arguments": "{}"}
    items = [
        {"role": "user", "content": "Weather in Oslo?"},
        *[o.model_dump(exclude_none=True) for o in first.output],
        fake_call,
        {"type": "function_call_output", "call_id": "call_x", "output": "Rain"},
    ]
    second = client.responses.create(
        model="m", instructions=INSTRUCTIONS, input=items, tools=[WEATHER], max_output_tokens=4
    )
    node = nodes_of(proxy, session)[second.id]
    assert node["parent_id"] is None
    assert node["messages"][2] == {
        "role": "assistant",
        "content": first.output_text,
        "tool_calls": [{"id": "call_x", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
    }


def test_previous_response_id_continues_the_stored_conversation(proxy):
    session = proxy.new_session()
    client = client_for(session)
    first = client.responses.create(
        model="m",
        instructions=INSTRUCTIONS,
        input="What's the weather in Paris?",
        tools=[WEATHER],
        tool_choice=NAMED,
        max_output_tokens=24,
        temperature=0,
    )
    [call] = first.output
    second = client.responses.create(
        model="m",
        instructions=INSTRUCTIONS,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
        tools=[WEATHER],
        max_output_tokens=8,
    )
    third = client.responses.create(
        model="m", previous_response_id=second.id, input="Thanks!", tools=[WEATHER], max_output_tokens=8
    )
    assert second.previous_response_id == first.id
    nodes = nodes_of(proxy, session)
    assert nodes[second.id]["parent_id"] == first.id and nodes[third.id]["parent_id"] == second.id
    assert_extends(nodes[first.id], nodes[second.id])
    assert nodes[third.id]["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="m", previous_response_id="resp_nope", input="hi", max_output_tokens=4)
    assert err.value.body["param"] == "previous_response_id"
    other = client_for(proxy.new_session())
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model="m", previous_response_id=first.id, input="hi", max_output_tokens=4)


def test_unknown_fields_are_ignored(proxy):
    session = proxy.new_session()
    r = client_for(session).responses.create(
        model="gpt-5.6-luna",
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
            {"role": "user", "content": "hi"},
        ],
        include=[],
        reasoning={"effort": "none"},
        text={"verbosity": "low"},
        store=False,
        metadata={"task": "t1"},
        parallel_tool_calls=False,
        truncation="disabled",
        top_p=0.9,
        temperature=0.7,
        max_output_tokens=6,
        extra_body={"return_token_ids": True, "some_future_field": {"x": 1}},
    )
    assert r.status == "completed" and r.metadata == {"task": "t1"} and r.top_p == 0.9
    [node] = nodes_of(proxy, session).values()
    assert node["messages"][0] == {"role": "system", "content": "Be brief."}
    assert node["sampling"]["temperature"] == 0.7


def test_output_text_logprobs_when_included(proxy):
    r = client_for(proxy.new_session()).responses.create(
        model="m",
        input="Say yes.",
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        max_output_tokens=5,
        temperature=0,
    )
    logprobs = r.output[0].content[0].logprobs
    assert logprobs and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in logprobs)
    assert "".join(e.token for e in logprobs) == r.output_text


def test_reasoning_items_are_kept_but_carry_no_tokens(proxy):
    session = proxy.new_session()
    client = client_for(session)
    first = client.responses.create(model="m", input="Say hi.", max_output_tokens=6)
    items = [
        {"role": "user", "content": "Say hi."},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Easy."}]},
        *[o.model_dump(exclude_none=True) for o in first.output],
        {"role": "user", "content": "Again."},
    ]
    second = client.responses.create(model="m", input=items, max_output_tokens=6)
    assert nodes_of(proxy, session)[second.id]["parent_id"] == first.id, "reasoning is not part of the hash"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": 5}, "input"),
        (
            {"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
            "input[0].call_id",
        ),
        ({"model": "m", "input": [{"type": "input_image", "image_url": "http://x"}]}, "input[0].type"),
        ({"model": "m", "input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "m", "input": "hi", "tool_choice": "required"}, "tool_choice"),
        ({"model": "m", "input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}}, None),
        ({"model": "m", "input": "hi", "temperature": 5}, "temperature"),
        ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "conversation": "conv_1"}, None),
    ],
)
def test_bad_requests_are_400_in_openai_shape(proxy, body, param):
    r = httpx.post(proxy.base_url + "/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param


def test_openai_client_raises_bad_request(proxy):
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input=[{"type": "function_call", "name": "f", "arguments": "{}"}])
