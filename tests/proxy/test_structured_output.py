"""Structured output through the real server and the real `openai` client, on the default model:
every sample at temperature 1 parses and validates against the schema asked for, in Chat
Completions (`response_format`, streamed or not), the Responses API (`text.format`) and the
Messages API (`output_config.format`); a schema llguidance refuses is a 400 naming what it
refused. On SQLite only: the store is not what is under test."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "colour": {"type": "string", "enum": ["red", "green", "blue"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "colour", "hobbies"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Invent a person: their name, age, favourite colour and hobbies, as JSON."}]
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.fixture(scope="module")
def client(sqlite_proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=sqlite_proxy.base_url, api_key="anything", max_retries=0)


def test_fifty_samples_at_temperature_one_all_validate(sqlite_proxy):
    session = sqlite_proxy.new_session()
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)

    def ten(seed: int):
        return client.chat.completions.create(
            model="m", messages=ASK, response_format=RESPONSE_FORMAT, n=10, temperature=1.0, seed=seed, max_tokens=160
        )

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(ten, range(0, 5000, 1000)))  # choice i draws with seed + i
    replies = [c for a in answers for c in a.choices]
    assert len(replies) == 50
    for choice in replies:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert len({c.message.content for c in replies}) > 25, "temperature 1 samples differ"
    # the record names the schema that held the reply: its logprobs are the masked distribution's
    recorded = sqlite_proxy.session(session["session_id"])["completions"]
    assert len(recorded) == 50
    assert all(json.loads(c["sampling"]["json_schema"]) == PERSON for c in recorded)


def test_json_object_mode_gives_a_json_object(client):
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Reply in JSON: what is the capital of France?"}],
        response_format={"type": "json_object"},
        n=4,
        temperature=1.0,
        seed=1,
        max_tokens=200,
        logprobs=True,
        top_logprobs=3,  # alternatives the grammar forbids are left out, never -inf
    )
    for choice in r.choices:
        assert all(len(t.top_logprobs) <= 3 for t in choice.logprobs.content)
        if choice.finish_reason == "stop":  # an unbounded object may run past max_tokens
            assert isinstance(json.loads(choice.message.content), dict)
        else:
            assert choice.message.content.startswith("{")
    assert any(c.finish_reason == "stop" for c in r.choices)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    population: int
    kind: Literal["capital", "port", "village"]


def test_the_clients_parse_helper_gets_its_pydantic_model(client):
    r = client.chat.completions.parse(
        model="m",
        messages=[{"role": "user", "content": "Describe a city as JSON."}],
        response_format=City,
        temperature=1.0,
        seed=11,
        max_tokens=120,
    )
    assert isinstance(r.choices[0].message.parsed, City)


def test_streamed_reply_validates(client):
    stream = client.chat.completions.create(
        model="m", messages=ASK, response_format=RESPONSE_FORMAT, temperature=1.0, seed=5, max_tokens=160, stream=True
    )
    pieces, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert finish == "stop" and len([p for p in pieces if p]) > 3
    jsonschema.validate(json.loads("".join(pieces)), PERSON)


def test_responses_text_format(client):
    r = client.responses.create(
        model="m",
        input=ASK[0]["content"],
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
        temperature=1.0,
        max_output_tokens=160,
        extra_body={"seed": 5},  # the same draw every run: whether 160 tokens finish the object is chance
    )
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"


def test_messages_output_format(sqlite_proxy):
    body = {"model": "m", "max_tokens": 160, "messages": ASK, "temperature": 1.0}
    session = sqlite_proxy.new_session(seed=5)  # the Messages API has no seed: its session's gives the same draw
    url, api_key = f"{sqlite_proxy.url}/sessions/{session['session_id']}/v1/messages", session["api_key"]
    for key, fmt in [("output_config", {"format": {"type": "json_schema", "schema": PERSON}})] + [
        ("output_format", {"type": "json_schema", "schema": PERSON})
    ]:
        r = httpx.post(url, json={**body, key: fmt}, headers={"x-api-key": api_key}, timeout=300)
        assert r.status_code == 200, r.text
        [block] = r.json()["content"]
        jsonschema.validate(json.loads(block["text"]), PERSON)


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "object", "not": {"required": ["a"]}}, '["not"]'),
        ({"type": "string", "pattern": "(?=a)b"}, "look-around"),
        ({"type": "string", "format": "no-such-format"}, "no-such-format"),
    ],
)
def test_an_unsupported_schema_is_a_400_naming_the_construct(client, schema, named):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=ASK, response_format=fmt, max_tokens=8)
    error = caught.value.body
    assert caught.value.status_code == 400 and named in error["message"], error
    assert error["param"] == "response_format" and error["type"] == "invalid_request_error"


def test_malformed_response_formats_are_400s(client):
    for fmt, param in [
        ({"type": "json_schema"}, "response_format.json_schema.schema"),
        ({"type": "yaml"}, "response_format.type"),
    ]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="m", messages=ASK, response_format=fmt, max_tokens=8)
        assert caught.value.body["param"] == param, caught.value.body


def test_a_forced_tool_call_with_a_json_format_is_refused(client):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(
            model="m", messages=ASK, response_format=RESPONSE_FORMAT, tools=[tool], tool_choice="required", max_tokens=8
        )
