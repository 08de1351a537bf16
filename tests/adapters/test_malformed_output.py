"""Malformed model output never breaks a real client's run through a protocol error.

The real model is steered (greedily, on a server whose required calls are not held by a grammar:
`engine.tool_call_grammar = false`) into three kinds of bad tool output:
- broken tool JSON: the named tool is forced and `max_tokens` cuts the call short;
- an unknown tool name: asked to call a tool that was not offered, with a call required;
- text after a tool call: a valid call that the model keeps talking after.
Each goes through the Agents SDK (Responses, streamed; Chat Completions), CAMEL and the
streamed anthropic client. The client must finish its run with a well-formed answer
(plain text for the first two, one valid tool call for the third), and the sampled
tokens, malformed or not, must be recorded as they were sampled.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import anthropic
import pytest
from agents import Agent, ModelSettings, Runner, function_tool
from camel.agents import ChatAgent

from adapters.camel import session_model
from adapters.openai_agents import session_run_config
from tests.adapters.conftest import add, assert_one_tree, episode_nodes, multiply
from tests.conftest import run_server


@pytest.fixture(scope="module")
def free_proxy(tmp_path_factory):
    """A server whose required tool calls are not held by a grammar: the model writes them itself."""
    tmp = tmp_path_factory.mktemp("free-calls")
    with run_server(tmp, f"sqlite:///{tmp}/areal.db", "--set", "engine.tool_call_grammar=false") as server:
        yield server


@dataclass
class Case:
    system: str
    question: str
    choice: str  # a tool name, or "required"
    max_tokens: int


CASES = {
    "broken_json": Case("You are a calculator. Use the tools.", "What is 7 plus 5?", "add", 3),
    "unknown_tool": Case(
        "You are a calculator. Use the tools.", "Call the tool named divide with a=8 and b=2.", "required", 30
    ),
    "text_after_call": Case("Call the add tool.", "Use the add tool to compute 9 + 4.", "required", 30),
}


@dataclass
class FirstReply:
    """What the client made of the first model reply."""

    text: str = ""
    calls: list[tuple[str, dict]] = field(default_factory=list)


async def agents_sdk(session: dict, case: Case, api: str) -> FirstReply:
    agent = Agent(
        name="calculator",
        instructions=case.system,
        model="smollm2-135m-instruct",
        tools=[function_tool(add), function_tool(multiply)],
        model_settings=ModelSettings(tool_choice=case.choice, max_tokens=case.max_tokens, temperature=0),
    )
    config = session_run_config(session["base_url"], session["api_key"], api=api)
    if api == "responses":
        result = Runner.run_streamed(agent, case.question, max_turns=4, run_config=config)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, case.question, max_turns=4, run_config=config)
    assert isinstance(result.final_output, str)
    first = FirstReply()
    for item in result.raw_responses[0].output:
        if item.type == "function_call":
            first.calls.append((item.name, json.loads(item.arguments)))
        elif item.type == "message":
            first.text += "".join(part.text for part in item.content if part.type == "output_text")
    return first


async def camel(session: dict, case: Case) -> FirstReply:
    choice = "required" if case.choice == "required" else {"type": "function", "function": {"name": case.choice}}
    config = {"temperature": 0, "max_tokens": case.max_tokens, "tool_choice": choice}
    agent = ChatAgent(
        system_message=case.system,
        model=session_model(session["base_url"], session["api_key"], model_config=config),
        tools=[add, multiply],
        max_iteration=1,
        token_limit=8192,
    )
    response = await agent.astep(case.question)
    records = response.info["tool_calls"]
    return FirstReply(text="" if records else response.msgs[0].content, calls=[(r.tool_name, r.args) for r in records])


ANTHROPIC_TOOLS = [
    {
        "name": fn.__name__,
        "description": fn.__doc__.splitlines()[0],
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
    for fn in (add, multiply)
]


async def anthropic_client(session: dict, case: Case) -> FirstReply:
    client = anthropic.AsyncAnthropic(base_url=session["base_url"].removesuffix("/v1"), api_key=session["api_key"])
    choice = {"type": "any"} if case.choice == "required" else {"type": "tool", "name": case.choice}
    try:
        async with client.messages.stream(
            model="m",
            system=case.system,
            messages=[{"role": "user", "content": case.question}],
            tools=ANTHROPIC_TOOLS,
            tool_choice=choice,
            max_tokens=case.max_tokens,
            extra_body={"temperature": 0},
        ) as stream:
            message = await stream.get_final_message()
    finally:
        await client.close()
    return FirstReply(
        text="".join(b.text for b in message.content if b.type == "text"),
        calls=[(b.name, b.input) for b in message.content if b.type == "tool_use"],
    )


CLIENTS = {
    "agents-responses-streamed": lambda s, c: agents_sdk(s, c, "responses"),
    "agents-chat": lambda s, c: agents_sdk(s, c, "chat_completions"),
    "camel": camel,
    "anthropic-streamed": anthropic_client,
}


def sampled_reply(tokenizer, node: dict) -> str:
    """The reply exactly as sampled: a forced tool-call opening plus the output tokens."""
    text = tokenizer.decode(node["prompt_ids"] + node["output_ids"], skip_special_tokens=False)
    return text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>")


def tool_call_body(reply: str) -> str:
    assert reply.startswith("<tool_call>"), reply
    return reply.removeprefix("<tool_call>").split("</tool_call>")[0].strip()


@pytest.mark.parametrize("client", list(CLIENTS))
def test_malformed_output_reaches_the_client_well_formed(free_proxy, tokenizer, client):
    proxy = free_proxy
    sessions = {name: proxy.new_session(task_id=f"malformed-{client}-{name}") for name in CASES}

    async def episodes():
        return await asyncio.gather(*(CLIENTS[client](sessions[name], case) for name, case in CASES.items()))

    firsts = dict(zip(CASES, asyncio.run(episodes())))
    for name, case in CASES.items():
        nodes = episode_nodes(proxy, sessions[name])
        assert_one_tree(nodes)
        root = nodes[0]
        assert len(root["output_ids"]) <= case.max_tokens
        reply, first = sampled_reply(tokenizer, root), firsts[name]
        if name == "broken_json":
            assert root["finish_reason"] == "length"
            with pytest.raises(json.JSONDecodeError):
                json.loads(tool_call_body(reply))
        elif name == "unknown_tool":
            called = json.loads(tool_call_body(reply))["name"]
            assert called not in ("add", "multiply"), reply
        else:
            assert reply.split("</tool_call>", 1)[1].strip(), f"no text after the call: {reply!r}"
        if name == "text_after_call":
            assert first.calls == [("add", {"a": 9, "b": 4})], "a valid call is delivered without the trailing text"
            assert root["response"]["tool_calls"][0]["function"]["name"] == "add"
        else:
            assert first.calls == [], "a malformed call is delivered as plain text"
            assert first.text == root["response"]["content"], "the client got what was recorded"
            assert first.text.strip() == reply.strip(), "and that is what the model sampled"
