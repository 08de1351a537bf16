"""Reply assembly over real token ids: streamed deltas equal the final message, for every family's
tool format and for reasoning; incremental detokenization stays exact and linear."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from proxy.parsers import Parsers, choose
from proxy.reply import ReplyBuilder
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model
from tests.parsers.test_families import FAMILIES, W, names_args
from tests.parsers.test_families import NAMES as FAMILY_TOOLS

NAMES = {"get_weather"}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy"))


@pytest.mark.parametrize(
    "text, stop, tools",
    [
        ("Hello there, how are you?", [], set()),
        ("Count: 1, 2, 3, 4", [","], set()),
        ("Let me check.  \n<tool_call>\n" + CALL + "\n</tool_call>", [], NAMES),
        ("Broken <tool_call>{not json</tool_call> trailing", [], NAMES),
        ("Plain answer with trailing spaces   ", [], NAMES),
        ("Ünïcödé ✓ and emoji 🌍 ok", [], set()),
    ],
)
def test_streamed_content_equals_final_message(tokenizer, text, stop, tools):
    ids = tokenizer.encode(text, add_special_tokens=False)
    builder = ReplyBuilder(tokenizer, stop, tools)
    streamed = "".join(builder.feed([t]).content for t in ids)
    rest, reply = builder.finish("stop")
    streamed += rest.content
    assert streamed == (reply.content or "")
    if stop:
        assert stop[0] not in (reply.content or "") and reply.finish_reason == "stop"
    if reply.tool_calls:
        assert reply.finish_reason == "tool_calls" and reply.content == "Let me check."


def test_incremental_text_equals_one_decode_of_every_id(tokenizer):
    """Any ids, fed one at a time (invalid UTF-8 sequences included), give the text one decode gives."""
    import random

    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 40))]
        builder = ReplyBuilder(tokenizer)
        streamed = "".join(builder.feed([t]).content for t in ids)
        rest, reply = builder.finish("length")
        assert streamed + rest.content == reply.content == tokenizer.decode(ids, skip_special_tokens=True)


def test_a_long_stream_decodes_each_token_once_not_the_whole_text(tokenizer):
    """4,000 tokens streamed: the decoded length summed over every decode call stays linear in the
    output (it was quadratic: the whole text decoded again for each token)."""
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 400, add_special_tokens=False)[:4000]
    decoded_ids = 0
    real = tokenizer.decode

    class Counting:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def decode(self, token_ids, **kw):
            nonlocal decoded_ids
            decoded_ids += len(token_ids)
            return real(token_ids, **kw)

    builder = ReplyBuilder(Counting(), stop=["never appears"])
    text = "".join(builder.feed([t]).content for t in ids) + builder.finish("length")[0].content
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded_ids < 10 * len(ids), decoded_ids  # a full decode per token would be ~8,000,000


def _stream(builder, ids):
    """Feed one token at a time; (reasoning, content, calls) streamed, and the final reply."""
    reasoning = content = ""
    calls = []
    for t in ids:
        d = builder.feed([t])
        reasoning, content, calls = reasoning + d.reasoning, content + d.content, calls + d.calls
    d, reply = builder.finish("stop")
    return (reasoning + d.reasoning, content + d.content, calls + d.calls), reply


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_token_by_token(tokenizer, family):
    text = "Checking.\n" + FAMILIES[family](("get_weather", W), ("get_time", {"tz": "CET"}))
    if family.startswith("llama"):
        text = text.removeprefix("Checking.\n")
    parsers = Parsers(choose("", False, family.split("/")[0]).tool_format)
    builder = ReplyBuilder(tokenizer, [], FAMILY_TOOLS, parsers=parsers)
    (reasoning, content, calls), reply = _stream(builder, tokenizer.encode(text, add_special_tokens=False))
    assert names_args(calls) == [("get_weather", W), ("get_time", {"tz": "CET"})]
    assert reply.tool_calls == calls and reply.finish_reason == "tool_calls"
    assert content == (reply.content or "") == ("" if family.startswith("llama") else "Checking.")


def test_reasoning_then_a_call_token_by_token(tokenizer):
    parsers = choose("<think></think>{% if tools %}<tool_call>{% endif %}", True)
    text = "<think>\nThe user wants Paris.\n</think>\n\n" + FAMILIES["hermes"](("get_weather", W))
    builder = ReplyBuilder(tokenizer, [], FAMILY_TOOLS, parsers=parsers)
    (reasoning, content, calls), reply = _stream(builder, tokenizer.encode(text, add_special_tokens=False))
    assert reasoning == reply.reasoning == "The user wants Paris.\n"
    assert content == "" and reply.content is None and names_args(calls) == [("get_weather", W)]
    assert reply.message()["reasoning_content"] == reasoning


def test_a_stop_string_inside_reasoning_ends_the_reply(tokenizer):
    parsers = choose("<think></think>", False)
    builder = ReplyBuilder(tokenizer, ["STOP"], None, parsers=parsers, reasoning_open=True)
    ids = tokenizer.encode("Thinking hard STOP and more</think>answer", add_special_tokens=False)
    (reasoning, content, _), reply = _stream(builder, ids)
    assert reasoning == reply.reasoning == "Thinking hard " and content == reply.content == ""
    assert reply.finish_reason == "stop" and reply.stop_sequence == "STOP"


def test_markers_that_are_special_tokens_are_kept(tokenizer):
    """Mistral's [TOOL_CALLS] is a special token: decoded with special tokens kept, EOS left out."""
    from transformers import AutoTokenizer

    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy"))
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    marker = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    ids = [marker, *tok.encode(json.dumps([{"name": "get_weather", "arguments": W}]), add_special_tokens=False)]
    ids.append(tok.eos_token_id)
    assert "[TOOL_CALLS]" not in tok.decode(ids, skip_special_tokens=True)
    parsers = Parsers(choose("", False, "mistral").tool_format, eos_ids=frozenset({tok.eos_token_id}))
    (_, content, calls), reply = _stream(ReplyBuilder(tok, [], FAMILY_TOOLS, parsers=parsers), ids)
    assert names_args(calls) == [("get_weather", W)] and content == ""
    (_, content, calls), _ = _stream(ReplyBuilder(tok, [], None, parsers=parsers), ids)
    assert calls == [] and "[TOOL_CALLS]" not in content  # no tools offered: decoded as before
