"""A CAMEL-AI ChatAgent in streaming mode (`stream=True` in its model config) through the proxy.

CAMEL then sends every call with `stream: true` and `astep` returns a stream of partial
responses, here read as deltas (`stream_accumulate=False`) the way a chat UI shows them.
Each episode is its own session, all on one event loop: a two-turn conversation and
a tool step (the tool named in `tool_choice`, which the 135M model needs; CAMEL sends
it on every call, so `max_iteration=2` bounds the step to two tool calls). Every call
must be recorded in one chain per episode, each turn extending its parent's exact
tokens, holding the text the deltas added up to (which the stored sampled tokens decode
to) or the tool calls CAMEL ran. A streamed step that ends on a tool call yields no
response at all (CAMEL 0.2.90), so the tool step is read from the agent's memory.
"""

from __future__ import annotations

import asyncio

from camel.agents import ChatAgent

from adapters.camel import session_model
from tests.adapters.conftest import add, assert_chain, episode_nodes, multiply

STREAMED = {"temperature": 0, "max_tokens": 26, "stream": True}


def forced(tool: str) -> dict:
    return {**STREAMED, "tool_choice": {"type": "function", "function": {"name": tool}}}


async def streamed_step(agent: ChatAgent, question: str):
    """The deltas the stream yielded, joined, and the step's last response."""
    stream = await agent.astep(question)
    deltas, last = [], None
    async for partial in stream:
        deltas += [m.content for m in partial.msgs]
        last = partial
    return "".join(deltas), last


async def conversation(session: dict, first: str, second: str) -> list[str]:
    model = session_model(session["base_url"], session["api_key"], model_config=STREAMED)
    agent = ChatAgent(
        system_message="You are a helpful calculator.", model=model, token_limit=8192, stream_accumulate=False
    )
    return [(await streamed_step(agent, question))[0] for question in (first, second)]


async def tool_step(session: dict, tool, question: str):
    model = session_model(session["base_url"], session["api_key"], model_config=forced(tool.__name__))
    agent = ChatAgent(
        system_message="You are a calculator. Use the tools.",
        model=model,
        tools=[add, multiply],
        max_iteration=2,
        token_limit=8192,
        stream_accumulate=False,
    )
    await streamed_step(agent, question)
    return agent.chat_history


def test_streamed_chat_agent_episodes_are_recorded_as_chains(sqlite_proxy, tokenizer):
    proxy = sqlite_proxy
    talks = [("What is 7 plus 5?", "Now add 10 to that."), ("What is 6 times 7?", "Explain it in one sentence.")]
    tools = [(add, "What is 7 plus 5?", 12), (multiply, "What is 6 times 7?", 42)]
    sessions = [proxy.new_session(task_id=f"camel-stream-{i}") for i in range(len(talks) + len(tools))]

    async def episodes():
        return await asyncio.gather(
            *(conversation(s, *t) for s, t in zip(sessions, talks)),
            *(tool_step(s, tool, q) for s, (tool, q, _) in zip(sessions[len(talks) :], tools)),
        )

    results = asyncio.run(episodes())
    for session, replies in zip(sessions, results[: len(talks)]):
        nodes = episode_nodes(proxy, session)
        assert_chain(nodes, 2)
        assert all(replies), "each turn streamed some text"
        assert [n["response"]["content"] for n in nodes] == replies, "the deltas add up to what was recorded"
        for node, reply in zip(nodes, replies):
            sampled = tokenizer.decode(node["output_ids"]).removesuffix(tokenizer.eos_token)
            assert sampled == reply, "the stored tokens are the streamed text"
        assert nodes[1]["messages"][-2] == {"role": "assistant", "content": replies[0]}
    for session, history, (tool, _, expected) in zip(sessions[len(talks) :], results[len(talks) :], tools):
        nodes = episode_nodes(proxy, session)
        assert_chain(nodes, 2)
        calls = [m["tool_calls"] for m in history if m["role"] == "assistant"]
        assert calls == [n["response"]["tool_calls"] for n in nodes], "CAMEL ran the calls that were recorded"
        assert calls[0][0]["function"]["name"] == tool.__name__
        echoed, tool_message = nodes[1]["messages"][-2:]
        assert echoed["tool_calls"] == calls[0]
        assert tool_message == {"role": "tool", "tool_call_id": calls[0][0]["id"], "content": str(expected)}
        assert [m for m in history if m["role"] == "tool"][0] == tool_message, "the tool's result was sent on"
