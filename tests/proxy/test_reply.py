"""Reply assembly: tool-call parsing rules, and streamed content equal to the final message."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from proxy.reply import ReplyBuilder, parse_tool_calls
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

NAMES = {"get_weather"}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize(
    "text, content, n_calls",
    [
        (f"<tool_call>\n{CALL}\n</tool_call>", None, 1),
        (f"Let me check.\n<tool_call>\n{CALL}\n</tool_call>", "Let me check.", 1),
        (f"<tool_call>\n{CALL}\n</tool", None, 1),  # cut off inside the closing tag
        (f"<tool_call>\n{CALL}\nI will now wait.", None, 1),  # ran on without closing
        (f"<tool_call>{CALL}</tool_call><tool_call>{CALL}</tool_call>", None, 2),
        ('<tool_call>{"name": "get_weather", "parameters": {"city": "Rome"}}</tool_call>', None, 1),
        ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>', None, 1),
    ],
)
def test_valid_calls(text, content, n_calls):
    got_content, calls = parse_tool_calls(text, NAMES)
    assert got_content == content and len(calls) == n_calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "unknown_tool", "arguments": {}}</tool_call>',  # a tool not offered
        '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',  # broken JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "get_weather", "arguments": [1, 2]}</tool_call>',  # arguments not an object
        f"<tool_call>{CALL}</tool_call><tool_call>oops</tool_call>",  # one bad block spoils all
    ],
)
def test_malformed_calls_stay_text(text):
    assert parse_tool_calls(text, NAMES) == (text, [])


def test_without_tools_tags_are_text():
    text = f"<tool_call>{CALL}</tool_call>"
    assert parse_tool_calls(text, set()) == (text, [])


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
    streamed = "".join(builder.feed([t]) for t in ids)
    rest, reply = builder.finish("stop")
    streamed += rest
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
        streamed = "".join(builder.feed([t]) for t in ids)
        rest, reply = builder.finish("length")
        assert streamed + rest == reply.content == tokenizer.decode(ids, skip_special_tokens=True)


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
    text = "".join(builder.feed([t]) for t in ids) + builder.finish("length")[0]
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded_ids < 10 * len(ids), decoded_ids  # a full decode per token would be ~8,000,000
