"""Family chat templates (written here from each family's documented format) over the default
model's tokenizer: the parsers each one selects, native tool rendering, and token-exact
continuation of a tool-calling turn through a tool result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from proxy.render import ParentTokens, Renderer
from proxy.reply import ReplyBuilder
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

TEMPLATES = Path(__file__).parent / "templates"
# template → (tool parser, reasoning parser, the reply the model "samples": text of one call of get_weather)
FAMILIES = {
    "qwen3": ("hermes", "qwen3", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    "llama3": ("llama3_json", "none", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "mistral": ("mistral", "none", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    "deepseek_r1": (
        "deepseek_v3",
        "qwen3",  # the same <think> markers
        "I need the weather tool.\n</think>\n\n<｜tool▁calls▁begin｜>"
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    ),
    "harmony": (
        "harmony",
        "harmony",
        "<|channel|>analysis<|message|>I need the weather tool.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
    ),
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy"))


def renderer(tokenizer, family: str) -> Renderer:
    tok = AutoTokenizer.from_pretrained(tokenizer.name_or_path)  # a copy: the template is set on it
    return Renderer(tok, (tok.eos_token_id,), (TEMPLATES / f"{family}.jinja").read_text())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_template_selects_its_family_parsers(tokenizer, family):
    r = renderer(tokenizer, family)
    assert r.native_tools
    tools, reasoning = r.parsers.names
    assert tools == FAMILIES[family][0] and (reasoning != "none") == (FAMILIES[family][1] != "none")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tool_turn_continues_token_exactly_through_the_result(tokenizer, family):
    r = renderer(tokenizer, family)
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What's the weather in Paris?"},
    ]
    first = r.prompt(messages, [WEATHER], None)
    assert "get_weather" in r.tokenizer.decode(first.ids)  # the tools went through the template
    sampled = r.encode(FAMILIES[family][2]) + [r.tokenizer.eos_token_id]
    # the reply as the proxy reads it
    builder = ReplyBuilder(r.tokenizer, [], {"get_weather"}, "", r.parsers, first.reasoning_open)
    for t in sampled:
        builder.feed([t])
    _, reply = builder.finish("stop")
    assert [c["function"]["name"] for c in reply.tool_calls] == ["get_weather"], reply
    assert json.loads(reply.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert (reply.reasoning is not None) == (family in ("deepseek_r1", "harmony"))
    # the client sends the call back with its result; the next prompt extends the sampled ids
    call_id = reply.tool_calls[0]["id"]
    messages += [reply.message(), {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 degrees"}]
    parent = ParentTokens(first.ids + sampled, 3, ended_with_eos=True, reasoning=reply.reasoning or "")
    second = r.prompt(messages, [WEATHER], parent)
    if family == "deepseek_r1":  # its template never renders past reasoning: the sampled sequence is not the history
        assert not second.parent_used
        return
    assert second.parent_used, "the template re-rendered history: not a continuation"
    assert second.ids[: len(parent.full_ids)] == parent.full_ids
    text = r.tokenizer.decode(second.new_ids)
    full = r.render(messages, [WEATHER], generation_prompt=True)
    assert full.endswith(text) and "Sunny, 21 degrees" in text


@pytest.mark.parametrize("echoed", [True, False], ids=["reasoning-echoed", "reasoning-dropped"])
def test_a_thinking_tool_turn_continues_only_when_its_reasoning_is_in_the_history(tokenizer, echoed):
    """Qwen3 keeps the reasoning of turns after the last user query, if the client sends it back
    (the Agents SDK does not): without it, the rendered history is not the sampled sequence."""
    r = renderer(tokenizer, "qwen3_thinking")
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = r.prompt(messages, [WEATHER], None)
    assert first.reasoning_open
    sampled = r.encode("Use the tool.\n</think>\n\n" + FAMILIES["qwen3"][2]) + [r.tokenizer.eos_token_id]
    builder = ReplyBuilder(r.tokenizer, [], {"get_weather"}, "", r.parsers, True)
    for t in sampled:
        builder.feed([t])
    _, reply = builder.finish("stop")
    assert reply.reasoning == "Use the tool.\n" and reply.tool_calls
    message = reply.message() if echoed else {k: v for k, v in reply.message().items() if k != "reasoning_content"}
    result = {"role": "tool", "tool_call_id": reply.tool_calls[0]["id"], "content": "Sunny"}
    parent = ParentTokens(first.ids + sampled, 2, ended_with_eos=True, reasoning=reply.reasoning)
    second = r.prompt([*messages, message, result], [WEATHER], parent)
    assert second.parent_used == echoed
    if echoed:
        assert second.ids[: len(parent.full_ids)] == parent.full_ids


def test_qwen3_dropping_past_reasoning_is_detected(tokenizer):
    """After a new user query the template drops the earlier turn's reasoning: the rendered history
    is then not the sampled sequence, and the turn does not continue its parent's ids."""
    r = renderer(tokenizer, "qwen3")
    messages = [{"role": "user", "content": "2+2?"}]
    first = r.prompt(messages, None, None)
    sampled = r.encode("<think>\nEasy.\n</think>\n\n4") + [r.tokenizer.eos_token_id]
    reply = {"role": "assistant", "content": "4", "reasoning_content": "Easy."}
    parent = ParentTokens(full_ids=first.ids + sampled, num_messages=2, ended_with_eos=True)
    assert not r.prompt([*messages, reply, {"role": "user", "content": "3+3?"}], None, parent).parent_used


def test_the_default_templates_tool_section_follows_each_set_of_tools(tokenizer):
    """SmolLM2's template takes no tools: a section listing them is added to the system prompt, kept
    per set of tools. Sets that differ only where compact JSON still differs each get their own."""
    r = Renderer(tokenizer, (tokenizer.eos_token_id,))
    assert not r.native_tools
    variants = [[WEATHER]]
    for change in ({"description": "Météo, 24 h"}, {"description": 1.0}, {"description": 1}, {"description": True}):
        variants.append([{**WEATHER, "function": {**WEATHER["function"], **change}}])
    variants.append([WEATHER, variants[1][0]])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    first = [r.render(messages, tools, True) for tools in variants]
    for tools, text in zip(variants * 2, first * 2, strict=True):  # again, now from what was kept
        rendered = r.render(messages, tools, True)
        assert rendered == text
        assert "\n".join(json.dumps(t) for t in tools) in rendered
    assert len(set(first)) == len(variants)


CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}},
]
CONVERSATIONS = [
    [{"role": "user", "content": "What's the weather in Paris?"}],
    [{"role": "system", "content": "Be brief. 東京 → ☂"}, {"role": "user", "content": ""}],
    [
        {"role": "user", "content": "Weather in Paris and Zürich?"},
        {"role": "assistant", "content": "Checking both.", "tool_calls": CALLS, "reasoning_content": "Two calls."},
        {"role": "tool", "content": "18 C", "tool_call_id": "call_1", "name": "get_weather"},
        {"role": "tool", "content": "12 C", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "Paris 18 C, Zürich 12 C.", "reasoning_content": "Both answered."},
        {"role": "user", "content": "Thanks!"},
    ],
]


@pytest.mark.parametrize("family", [*FAMILIES, "default"])
def test_the_direct_rendering_is_apply_chat_templates(tokenizer, family):
    """The renderer renders through the compiled template (transformers' own per-call preparation
    left out); every conversation shape must come out exactly as `apply_chat_template` renders it."""
    if family == "default":
        tok = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
        r = Renderer(tok, (tok.eos_token_id,))
    else:
        r = renderer(tokenizer, family)
    assert r._compiled is not None  # the direct path is the one taken
    for messages in CONVERSATIONS:
        for tools in (None, [WEATHER]):
            for generation_prompt in (True, False):
                template_messages = r._template_messages(messages, tools)
                kwargs = {"tools": tools} if tools and r.native_tools else {}
                expected = r.tokenizer.apply_chat_template(
                    template_messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
                )
                assert r.render(messages, tools, generation_prompt) == expected, (family, messages, tools)


def test_a_direct_rendering_that_differs_is_not_used(tokenizer, monkeypatch):
    """Where the compiled template does not render as `apply_chat_template` (here: another template's
    compilation), the renderer goes through `apply_chat_template`, and renders right."""
    import proxy.render as render

    other = (TEMPLATES / "llama3.jinja").read_text()
    real = render._compiled_template
    monkeypatch.setattr(render, "_compiled_template", lambda tok, template: real(tok, other))
    r = renderer(tokenizer, "qwen3")
    assert r._compiled is None
    messages = CONVERSATIONS[2]
    expected = r.tokenizer.apply_chat_template(
        r._template_messages(messages, [WEATHER]), tools=[WEATHER], tokenize=False, add_generation_prompt=True
    )
    assert r.render(messages, [WEATHER], True) == expected
