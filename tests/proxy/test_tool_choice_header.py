"""`X-Areal-Tool-Choice`: a tool choice for clients that never send one (the Claude Code CLI).

It holds on a turn that starts from the user and only where the body chose nothing; a turn that
reads a tool's result is left on `auto`, so the model can answer. Each API reads it the same way,
through the real `openai` and `anthropic` clients against a real server with the real model.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.proxy.test_chat_api import NAMED, WEATHER
from tests.proxy.test_messages_api import WEATHER as CLAUDE_WEATHER

HEADER = "X-Areal-Tool-Choice"
QUESTION = [{"role": "user", "content": "Tell me a joke."}]  # nothing here asks for the tool


def chat(proxy, session: dict, header: str | None, **kwargs):
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    headers = {HEADER: header} if header is not None else {}
    defaults = {"model": "m", "messages": QUESTION, "tools": [WEATHER], "max_tokens": 24, "temperature": 0}
    return client.chat.completions.create(**{**defaults, **kwargs}, extra_headers=headers)


def recorded(proxy, session: dict, response_id: str) -> dict:
    [node] = [n for n in proxy.session(session["session_id"])["completions"] if n["id"] == response_id]
    return node


@pytest.mark.parametrize("header", ["get_weather", "required", "any"])
def test_header_forces_a_call_on_a_user_turn(sqlite_proxy, header):
    session = sqlite_proxy.new_session()
    r = chat(sqlite_proxy, session, header)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    expected = NAMED if header == "get_weather" else "required"
    assert recorded(sqlite_proxy, session, r.id)["sampling"]["tool_choice"] == expected


def test_turn_reading_a_tool_result_stays_auto(sqlite_proxy):
    session = sqlite_proxy.new_session()
    first = chat(sqlite_proxy, session, "get_weather")
    [call] = first.choices[0].message.tool_calls
    messages = [
        *QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    second = chat(sqlite_proxy, session, "get_weather", messages=messages)
    node = recorded(sqlite_proxy, session, second.id)
    assert node["sampling"]["tool_choice"] == "auto"
    assert node["parent_id"] == first.id, "the turn continues the forced call's exact tokens"
    # A new question sent with the tool's result (no answer between) is the user's turn: forced.
    asked = chat(sqlite_proxy, session, "get_weather", messages=[*messages, *QUESTION])
    assert recorded(sqlite_proxy, session, asked.id)["sampling"]["tool_choice"]["function"]["name"] == "get_weather"
    # A user turn after that answer is forced again.
    third = chat(
        sqlite_proxy,
        session,
        "get_weather",
        messages=[*messages, second.choices[0].message.model_dump(exclude_none=True), *QUESTION],
    )
    assert recorded(sqlite_proxy, session, third.id)["sampling"]["tool_choice"]["function"]["name"] == "get_weather"


def test_body_choice_wins_and_no_tools_ignores_it(sqlite_proxy):
    session = sqlite_proxy.new_session()
    r = chat(sqlite_proxy, session, "get_weather", tool_choice="none")
    assert r.choices[0].message.tool_calls is None
    assert recorded(sqlite_proxy, session, r.id)["sampling"]["tool_choice"] == "none"
    plain = chat(sqlite_proxy, session, "get_weather", tools=openai.NOT_GIVEN)
    assert recorded(sqlite_proxy, session, plain.id)["sampling"]["tool_choice"] == "auto"


def test_bad_header_is_a_400_naming_it(sqlite_proxy):
    session = sqlite_proxy.new_session()
    with pytest.raises(openai.BadRequestError) as info:
        chat(sqlite_proxy, session, "get_time")
    error = info.value.body
    assert error["param"] == HEADER and error["type"] == "invalid_request_error"
    assert "get_weather" in error["message"], "the message lists the tools it could name"
    empty = httpx.post(
        f"{session['base_url']}/chat/completions",
        headers={"Authorization": f"Bearer {session['api_key']}", HEADER: ""},
        json={"model": "m", "messages": QUESTION, "tools": [WEATHER], "max_tokens": 4},
        timeout=120,
    )
    assert empty.status_code == 400 and empty.json()["error"]["param"] == HEADER
    assert sqlite_proxy.session(session["session_id"])["completions"] == [], "nothing recorded"


def test_messages_and_responses_read_it(sqlite_proxy):
    session = sqlite_proxy.new_session()
    claude = anthropic.Anthropic(
        base_url=session["base_url"].removesuffix("/v1"), api_key=session["api_key"], max_retries=0
    )
    reply = claude.messages.create(
        model="claude-sonnet-4-5",
        messages=QUESTION,
        tools=[CLAUDE_WEATHER],
        max_tokens=24,
        extra_body={"temperature": 0},
        extra_headers={HEADER: "get_weather"},
    )
    assert reply.stop_reason == "tool_use"
    assert [b.name for b in reply.content if b.type == "tool_use"] == ["get_weather"]
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(
            model="claude-sonnet-4-5",
            messages=QUESTION,
            tools=[CLAUDE_WEATHER],
            max_tokens=24,
            extra_headers={HEADER: "get_time"},
        )
    assert info.value.body["type"] == "error" and "X-Areal-Tool-Choice" in info.value.body["error"]["message"]

    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    response = client.responses.create(
        model="m",
        input="Tell me a joke.",
        tools=[{"type": "function", **WEATHER["function"]}],
        max_output_tokens=24,
        temperature=0,
        extra_headers={HEADER: "required"},
    )
    assert [item.type for item in response.output] == ["function_call"]
    assert response.tool_choice == "required"
