"""A required tool call is held to its family's format by a grammar: whatever tokens the grammar
allows, the reply parses as one valid call whose arguments match the tool's parameters.

Decoding is simulated with the worst possible model: a token drawn uniformly among the ones the
grammar allows, over the default model's tokenizer (seeded: the same walks every run).
"""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
from llguidance import LLMatcher
from llguidance.hf import from_tokenizer
from transformers import AutoTokenizer

from proxy.parsers import TOOL_FORMATS
from proxy.parsers.stream import ToolSection
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"enum": ["CET", "UTC"]}},
                "required": ["tz"],
                "additionalProperties": False,
            },
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy"))
    return tok, from_tokenizer(tok, n_vocab=len(tok), eos_token=[tok.eos_token_id])


def walk(lltok, grammar: str, vocab: int, rng: random.Random) -> list[int]:
    matcher = LLMatcher(lltok, LLMatcher.grammar_from_lark(grammar), log_level=0)
    ids: list[int] = []
    while not matcher.is_accepting():
        assert len(ids) < 400, "the grammar let the reply run on"
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = np.nonzero(bits[:vocab])[0]
        token = int(allowed[rng.randrange(len(allowed))])
        assert matcher.consume_token(token), matcher.get_error()
        ids.append(token)
    return ids


def calls_of(fmt, text: str) -> list[dict]:
    stage = fmt.reply_stage(set(PARAMS))
    if stage is not None:
        first, last = stage.feed(text, False), stage.feed("", True)
        return first.calls + last.calls
    section = ToolSection(fmt(set(PARAMS)))
    _, calls = section.feed(text, False)
    return calls + section.feed("", True)[1]


@pytest.mark.parametrize("family", ["hermes", "llama3_json", "mistral", "deepseek_v3", "harmony"])
@pytest.mark.parametrize("offered", ["one", "both"])
def test_any_path_through_the_grammar_is_one_valid_call(tokenizer, family, offered):
    tok, lltok = tokenizer
    tools = TOOLS[:1] if offered == "one" else TOOLS
    fmt = TOOL_FORMATS[family]
    prefix, grammar = fmt.call_grammar(tools)
    assert not LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar))
    rng = random.Random(f"{family}-{offered}")
    seen = set()
    for _ in range(20):
        text = prefix + tok.decode(walk(lltok, grammar, len(tok), rng))
        calls = calls_of(fmt, text)
        assert len(calls) == 1, text
        name, args = calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])
        jsonschema.validate(args, PARAMS[name])
        seen.add(name)
    assert seen == {t["function"]["name"] for t in tools}  # every offered tool is reachable


SILENT = {  # the Claude Code test's tool: nothing said of other keys
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99},
                "b": {"type": "integer", "minimum": 0, "maximum": 99},
            },
        },
    },
}


@pytest.mark.parametrize("family", ["hermes", "harmony"])
def test_a_schema_silent_on_other_keys_takes_only_its_own(tokenizer, family):
    """JSON Schema lets such an object take any key; the forced call's grammar does not, or a model
    can write a free-text key until max_tokens (a CI failure of the Claude Code test)."""
    tok, lltok = tokenizer
    fmt = TOOL_FORMATS[family]
    prefix, grammar = fmt.call_grammar([SILENT])
    rng = random.Random(family)
    for _ in range(20):
        text = prefix + tok.decode(walk(lltok, grammar, len(tok), rng))
        stage = fmt.reply_stage({"add"})
        if stage is not None:
            calls = stage.feed(text, False).calls + stage.feed("", True).calls
        else:
            section = ToolSection(fmt({"add"}))
            calls = section.feed(text, False)[1] + section.feed("", True)[1]
        [call] = calls
        assert set(json.loads(call["function"]["arguments"])) <= {"a", "b"}, text


def test_closed_leaves_what_a_schema_says_of_other_keys():
    from proxy.parsers.base import closed

    obj = {"type": "object", "properties": {"x": {"type": "object", "properties": {"y": {}}}}}
    assert closed(obj) == {
        "type": "object",
        "properties": {"x": {"type": "object", "properties": {"y": {}}, "additionalProperties": False}},
        "additionalProperties": False,
    }
    others = ({"additionalProperties": True}, {"additionalProperties": {"type": "string"}}, {"patternProperties": {}})
    for said in others:
        assert closed({"properties": {"x": {}}, **said}) == {"properties": {"x": {}}, **said}
    parts = {"allOf": [{"properties": {"x": {}}}, {"properties": {"y": {}}}]}
    assert closed(parts) == parts  # each part's siblings declare keys it must accept
    beside = {"properties": {"kind": {}}, "anyOf": [{"properties": {"x": {}}}, {"properties": {"y": {}}}]}
    assert closed(beside) == beside  # each alternative takes the parent's `kind` too
    union = {"anyOf": [{"properties": {"x": {}}}, {"type": "string"}]}
    assert closed(union)["anyOf"][0]["additionalProperties"] is False  # an alternative on its own: closed
    assert closed({"not": {"properties": {"x": {}}}}) == {"not": {"properties": {"x": {}}}}
    assert closed({"type": "object"}) == {"type": "object"}  # no properties listed: any object
    listed = {"type": "array", "items": {"properties": {"x": {}}}}
    assert closed(listed)["items"]["additionalProperties"] is False
