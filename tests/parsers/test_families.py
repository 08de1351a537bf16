"""Each family's tool-call parser on literal model outputs: plain, parallel, streamed, malformed.

Every case runs twice: whole, and fed one character at a time (the finest split a token stream
can make); the calls and the content must come out the same, and the content streamed must be
the final content.
"""

from __future__ import annotations

import json

import pytest

from proxy.parsers import TOOL_FORMATS
from proxy.parsers.base import REASONING_FORMATS
from proxy.parsers.harmony import HarmonyStream
from proxy.parsers.stream import Delta, ReasoningSplitter, ToolSection

NAMES = {"get_weather", "get_time"}
W = {"city": "Paris"}
T = {"tz": "CET"}


def hermes(*calls):
    return "".join(f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>\n' for n, a in calls)


def llama(*calls):
    return "<|python_tag|>" + "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def mistral(*calls):
    return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])


def mistral_v11(*calls):
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a)}" for n, a in calls)


def deepseek(*calls):
    begin, sep, end = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
    inner = "".join(f"{begin}function{sep}{n}\n```json\n{json.dumps(a)}\n```{end}" for n, a in calls)
    return f"<｜tool▁calls▁begin｜>{inner}<｜tool▁calls▁end｜>"


def deepseek_v31(*calls):
    inner = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{json.dumps(a)}<｜tool▁call▁end｜>" for n, a in calls)
    return f"<｜tool▁calls▁begin｜>{inner}<｜tool▁calls▁end｜>"


FAMILIES = {
    "hermes": hermes,
    "llama3_json": llama,
    "mistral": mistral,
    "mistral/v11": mistral_v11,
    "deepseek_v3": deepseek,
    "deepseek_v3/v31": deepseek_v31,
}


def run(parser: str, text: str, pieces: bool) -> tuple[str, list[dict], str]:
    """(content, calls, content as streamed)."""
    section = ToolSection(TOOL_FORMATS[parser.split("/")[0]](NAMES))
    chunks = list(text) if pieces else [text]
    streamed, calls = "", []
    for chunk in chunks:
        content, new = section.feed(chunk, final=False)
        streamed += content
        calls += new
    content, new = section.feed("", final=True)
    return streamed + content, calls + new, streamed + content


def names_args(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "by-char"])
def test_one_call(family, pieces):
    content, calls, _ = run(family, FAMILIES[family](("get_weather", W)), pieces)
    assert names_args(calls) == [("get_weather", W)] and content == ""
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "by-char"])
def test_parallel_calls(family, pieces):
    text = FAMILIES[family](("get_weather", W), ("get_time", T))
    content, calls, _ = run(family, text, pieces)
    assert names_args(calls) == [("get_weather", W), ("get_time", T)] and content == ""


@pytest.mark.parametrize("family", [f for f in FAMILIES if not f.startswith("llama")])
@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "by-char"])
def test_text_before_the_calls_is_content(family, pieces):
    text = "Let me check that.  \n" + FAMILIES[family](("get_weather", W))
    content, calls, streamed = run(family, text, pieces)
    assert content == "Let me check that." == streamed and names_args(calls) == [("get_weather", W)]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "by-char"])
def test_plain_answers_stay_content(family, pieces):
    for text in ["The weather in Paris is sunny.", "  leading blanks and trailing  ", '{"answer": 42}']:
        content, calls, streamed = run(family, text, pieces)
        assert calls == [] and content == text == streamed


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "by-char"])
@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t.replace("get_weather", "no_such_tool"),  # a tool not offered
        lambda t: t.replace('"Paris"}', '"Paris"'),  # broken JSON
        lambda t: t[: len(t) * 2 // 3],  # cut off mid-call (max_tokens)
    ],
    ids=["unknown-tool", "broken-json", "cut-off"],
)
def test_malformed_calls_stay_content(family, pieces, mangle):
    text = mangle(FAMILIES[family](("get_weather", W)))
    content, calls, streamed = run(family, text, pieces)
    assert calls == [] and content == text == streamed


@pytest.mark.parametrize("family", ["hermes", "mistral/v11", "deepseek_v3"])
def test_a_bad_block_after_a_good_one_keeps_the_good_one(family):
    good = FAMILIES[family](("get_weather", W))
    bad = FAMILIES[family](("no_such_tool", T))
    for pieces in (False, True):
        content, calls, streamed = run(family, good + bad, pieces)
        assert names_args(calls) == [("get_weather", W)]
        assert "no_such_tool" in content and content == streamed


def test_hermes_run_on_text_after_a_call_is_dropped():
    text = '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris"}}\nI will now wait.'
    for pieces in (False, True):
        content, calls, _ = run("hermes", text, pieces)
        assert names_args(calls) == [("get_weather", W)] and content == ""


def test_arguments_given_as_a_json_string_are_read():
    text = '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>'
    assert names_args(run("hermes", text, True)[1]) == [("get_weather", W)]


def test_calls_are_emitted_as_each_one_completes():
    """A streamed parallel call: the first call comes out before the second one's text arrives."""
    first = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    section = ToolSection(TOOL_FORMATS["hermes"](NAMES))
    seen = []
    for ch in first:
        seen += section.feed(ch, final=False)[1]
    assert len(seen) == 1  # complete at its closing tag, before anything else arrives
    section.feed('<tool_call>\n{"name": "get_time", "arguments": ', final=False)
    assert section.feed('{"tz": "CET"}}\n</tool_call>', final=False)[1][0]["function"]["name"] == "get_time"


def test_the_config_offers_every_registered_parser():
    from typing import get_args

    from proxy.engines.config import ReasoningParser, ToolParser

    assert set(get_args(ToolParser)) == {"auto", *TOOL_FORMATS}
    assert set(get_args(ReasoningParser)) == {"auto", "none", *REASONING_FORMATS}


# -- reasoning -----------------------------------------------------------------------------
def split(text: str, inside: bool, pieces: bool) -> tuple[str, str]:
    splitter = ReasoningSplitter(REASONING_FORMATS["qwen3"], inside)
    reasoning = content = ""
    for chunk in list(text) if pieces else [text]:
        r, c = splitter.feed(chunk, final=False)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.feed("", final=True)
    return reasoning + r, content + c


@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "by-char"])
@pytest.mark.parametrize(
    "text, inside, reasoning, content",
    [
        ("<think>\nAdd the tens.\n</think>\n\nThe answer is 42.", False, "Add the tens.\n", "The answer is 42."),
        ("Add the tens.\n</think>\n\n42", True, "Add the tens.\n", "42"),  # the prompt opened the block
        ("<think>\n\n</think>\n\nNo thinking needed.", False, "", "No thinking needed."),
        ("The answer is 42.", False, "", "The answer is 42."),
        ("<think>\nStill thinking when cut off", False, "Still thinking when cut off", ""),
        ("Mentions <think> later: no reasoning", False, "", "Mentions <think> later: no reasoning"),
    ],
)
def test_reasoning_split(text, inside, reasoning, content, pieces):
    assert split(text, inside, pieces) == (reasoning, content)


# -- harmony (gpt-oss): reasoning, content and calls are channels of one stream -------------------
def harmony_run(text: str, pieces: bool):
    stream = HarmonyStream(NAMES)
    out = Delta()
    for chunk in [*(list(text) if pieces else [text]), None]:
        d = stream.feed(chunk or "", final=chunk is None)
        out.reasoning += d.reasoning
        out.content += d.content
        out.calls += d.calls
    return out


ANALYSIS = "<|channel|>analysis<|message|>Need the weather.<|end|>"


def harmony_call(name, args, end="<|call|>"):
    head = f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
    return head + json.dumps(args) + end


@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "by-char"])
@pytest.mark.parametrize(
    "text, reasoning, content, calls",
    [
        (ANALYSIS + harmony_call("get_weather", W, ""), "Need the weather.", "", [("get_weather", W)]),
        (ANALYSIS + harmony_call("get_weather", W, "<|end|>") + harmony_call("get_time", T), "Need the weather.", "",
         [("get_weather", W), ("get_time", T)]),
        (ANALYSIS + "<|start|>assistant<|channel|>final<|message|>Sunny.<|return|>", "Need the weather.", "Sunny.", []),
        ("<|channel|>final<|message|>Just the answer.", "", "Just the answer.", []),
        ("Plain text, no harmony at all.", "", "Plain text, no harmony at all.", []),
        (ANALYSIS + harmony_call("no_such_tool", W), "Need the weather.", None, []),
        (ANALYSIS + harmony_call("get_weather", W)[:-20], "Need the weather.", None, []),  # cut off mid-call
    ],
    ids=["call", "parallel", "final", "final-only", "plain", "unknown-tool", "cut-off"],
)  # fmt: skip
def test_harmony(text, reasoning, content, calls, pieces):
    out = harmony_run(text, pieces)
    assert out.reasoning == reasoning and names_args(out.calls) == calls
    if content is None:  # a malformed call stays the model's text
        assert "to=functions." in out.content
    else:
        assert out.content == content
