"""End to end through `areal-proxy serve` with each family's chat template (tests/parsers/templates)
and the real clients: tool calls in the family's format come back as `tool_calls`, reasoning as
reasoning (chat, responses, messages; streamed and not), and a template that re-renders history
is recorded as a linked segment, each sequence exact.

The default model does not speak these formats by itself; its output is steered into them the
way a user would: `tool_choice` naming a tool (or `required`) holds the reply to one call in the
family's format by a grammar (greedy), and DeepSeek-R1's template opens `<think>` in the
generation prompt (as Qwen3's thinking-2507 template does), so what the model writes is reasoning
until it closes the block.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from proxy.conversation import normalize_messages
from proxy.render import Renderer
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model
from tests.conftest import run_server

TEMPLATES = Path(__file__).parents[1] / "parsers" / "templates"
GREEDY = {"temperature": 0}  # the anthropic client takes no temperature argument here
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"enum": ["CET", "UTC"]}}, "required": ["tz"]},
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


THINKING = ("qwen3_thinking", "deepseek_r1")  # templates whose generation prompt opens <think>


@pytest.fixture(scope="module", params=["qwen3", "qwen3_thinking", "llama3", "mistral", "deepseek_r1"])
def family(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"family-{request.param}")
    template = f"engine.chat_template={TEMPLATES / (request.param + '.jinja')}"
    with run_server(tmp, f"sqlite:///{tmp}/areal.db", "--set", template) as server:
        yield request.param, server


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy"))


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def test_a_named_tool_call_comes_back_as_tool_calls(family):
    name, server = family
    for stream, choice in ((False, NAMED), (True, NAMED), (False, "required")):
        # DeepSeek's markers are many tokens each in the default vocabulary: room for them
        kw = dict(model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=200, temperature=0)
        if stream:
            calls: dict[int, dict] = {}
            finish = None
            for chunk in client(server).chat.completions.create(stream=True, **kw):
                for choice in chunk.choices:
                    for d in choice.delta.tool_calls or ():
                        c = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                        c["id"] = d.id or c["id"]
                        c["name"] += (d.function.name or "") if d.function else ""
                        c["arguments"] += (d.function.arguments or "") if d.function else ""
                    finish = choice.finish_reason or finish
            got = [(c["name"], json.loads(c["arguments"])) for c in calls.values()]
        else:
            r = client(server).chat.completions.create(**kw)
            finish = r.choices[0].finish_reason
            got = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls or ()]
        assert finish == "tool_calls" and len(got) == 1, (name, stream, got)
        if choice == NAMED:
            assert got[0][0] == "get_weather"
        jsonschema.validate(got[0][1], {"get_weather": WEATHER, "get_time": TIME}[got[0][0]]["function"]["parameters"])


def _reasoning_only(family):
    name, server = family
    if name not in THINKING:
        pytest.skip("this template does not open the reasoning block in the prompt")
    return server


def test_reasoning_in_chat_completions(family, tokenizer):
    server = _reasoning_only(family)
    session = server.new_session(task_id="think")
    oa = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    r = oa.chat.completions.create(model="m", messages=ASK, max_tokens=24, temperature=0)
    message = r.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and "<think>" not in reasoning and not message.content
    streamed = {"reasoning": "", "content": ""}
    for chunk in oa.chat.completions.create(model="m", messages=ASK, max_tokens=24, temperature=0, stream=True):
        for choice in chunk.choices:
            streamed["reasoning"] += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            streamed["content"] += choice.delta.content or ""
    assert streamed == {"reasoning": reasoning, "content": message.content or ""}
    # the recorded tokens are what was sampled: the reasoning's own tokens, nothing cut
    node = next(n for n in server.session(session["session_id"])["completions"] if n["id"] == r.id)
    assert node["response"]["reasoning_content"] == reasoning
    assert tokenizer.decode(node["output_ids"], skip_special_tokens=True).strip() == reasoning.strip()


def test_reasoning_in_responses_and_messages(family):
    server = _reasoning_only(family)
    oa = client(server)
    r = oa.responses.create(model="m", input="What's the weather in Paris?", max_output_tokens=24, temperature=0)
    kinds = [item.type for item in r.output]
    assert kinds[0] == "reasoning" and r.output[0].content[0].text, kinds
    events = list(oa.responses.create(model="m", input="What's 2+2?", max_output_tokens=24, temperature=0, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = events[-1].response
    assert done.output[0].type == "reasoning" and done.output[0].content[0].text == deltas != ""
    ac = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    m = ac.messages.create(model="m", max_tokens=24, messages=[{"role": "user", "content": "Hi"}], extra_body=GREEDY)
    assert m.content[0].type == "thinking" and m.content[0].thinking
    with ac.messages.stream(
        model="m", max_tokens=24, messages=[{"role": "user", "content": "Hi"}], extra_body=GREEDY
    ) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking


def test_a_rewritten_history_is_a_linked_segment(family, tokenizer):
    """Qwen3's template drops a past turn's reasoning once a new user query follows: the next
    prompt's ids are not the parent's sequence extended, so the turn starts a new sequence linked
    to its parent; both sequences are exact, and the rewrite is counted."""
    name, server = family
    if name != "qwen3_thinking":
        pytest.skip("the Qwen3 thinking template is the one that drops past reasoning")
    session = server.new_session(task_id="rewrite")
    oa = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    first = oa.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=0)
    said = first.choices[0].message
    assert said.model_extra["reasoning_content"]  # cut off while thinking: all of it is reasoning
    reply = {"role": "assistant", "content": said.content, "reasoning_content": said.model_extra["reasoning_content"]}
    messages = [*ASK, reply, {"role": "user", "content": "And in Rome?"}]
    second = oa.chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=0)
    tree = server.session(session["session_id"])
    nodes = {n["id"]: n for n in tree["completions"]}
    parent, child = nodes[first.id], nodes[second.id]
    assert child["parent_id"] == first.id and child["segment_start"] and not parent["segment_start"]
    assert tree["history_rewrites"] == 1
    parent_full = parent["prompt_ids"] + parent["output_ids"]
    assert child["prompt_ids"][: len(parent_full)] != parent_full  # the sampled reasoning is gone
    # the segment's prompt is exactly the template's rendering of the conversation, as the model sees it
    renderer = Renderer(tokenizer, (tokenizer.eos_token_id,), (TEMPLATES / "qwen3_thinking.jinja").read_text())
    assert child["prompt_ids"] == renderer.prompt(normalize_messages(messages), None, None).ids
    # the next turn continues the segment's own sequence exactly
    said = second.choices[0].message
    reply = {"role": "assistant", "content": said.content, "reasoning_content": said.model_extra["reasoning_content"]}
    messages += [reply]
    third = oa.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0)
    nodes = {n["id"]: n for n in server.session(session["session_id"])["completions"]}
    child, grandchild = nodes[second.id], nodes[third.id]
    assert grandchild["parent_id"] == second.id and not grandchild["segment_start"]
    child_full = child["prompt_ids"] + child["output_ids"]
    assert grandchild["prompt_ids"][: len(child_full)] == child_full
    assert "areal_history_rewrites_total 1" in server.get("/metrics").text


def test_an_agents_sdk_agent_calls_its_tool_in_the_family_format(family):
    """The OpenAI Agents SDK, its first call forced to the tool, on Qwen3's and Llama 3's formats."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool

    name, server = family
    if name not in ("qwen3", "llama3"):
        pytest.skip("one Hermes-style and one JSON-style family")

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    session = server.new_session(task_id=f"agent-{name}")
    client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    kind = OpenAIResponsesModel if name == "qwen3" else OpenAIChatCompletionsModel
    agent = Agent(
        name="calculator",
        instructions="Use the add tool, then state the result.",
        model=kind(model="m", openai_client=client),
        tools=[function_tool(add)],
        model_settings=ModelSettings(tool_choice="add", max_tokens=40, temperature=0),
    )
    result = asyncio.run(Runner.run(agent, "What is 7 plus 5?", max_turns=3))
    calls = [i.raw_item for i in result.new_items if i.type == "tool_call_item"]
    outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
    assert calls and outputs, result.new_items
    args = json.loads(calls[0].arguments)
    assert outputs[0] == args["a"] + args["b"]  # the SDK ran the tool on the arguments the grammar held valid
    nodes = sorted(server.session(session["session_id"])["completions"], key=lambda n: n["depth"])
    assert len(nodes) == len(result.raw_responses) >= 2
    for parent, child in zip(nodes, nodes[1:]):
        assert child["parent_id"] == parent["id"]
        full = parent["prompt_ids"] + parent["output_ids"]
        assert (child["prompt_ids"] + child["output_ids"])[: len(full)] == full, "token-exact continuation"
