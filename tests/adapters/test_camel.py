"""A CAMEL-AI ChatAgent through the proxy, its backend from `adapters.camel.session_model`.

Several episodes, each its own session: a two-turn conversation, and a tool-using
step (the tool named in `tool_choice`, which the 135M model needs; CAMEL sends it on
every call, so `max_iteration=2` bounds the step to two calls). Every model call
must be recorded and linked into one chain per episode, each turn extending its
parent's exact tokens, and building the agent must need no network (CAMEL's own
token counter would download a tiktoken file).
"""

from __future__ import annotations

import asyncio

import pytest
from camel.agents import ChatAgent

from adapters.camel import OfflineTokenCounter, session_model
from tests.adapters.conftest import add, assert_chain, episode_nodes, multiply

GREEDY = {"temperature": 0, "max_tokens": 26}


def forced(tool: str) -> dict:
    return {**GREEDY, "tool_choice": {"type": "function", "function": {"name": tool}}}


async def conversation(session: dict, first: str, second: str) -> list[str]:
    model = session_model(session["base_url"], session["api_key"], model_config=GREEDY)
    agent = ChatAgent(system_message="You are a helpful calculator.", model=model, token_limit=8192)
    assert isinstance(agent.model_backend.token_counter, OfflineTokenCounter)
    replies = []
    for question in (first, second):
        response = await agent.astep(question)
        replies.append(response.msgs[0].content)
    return replies


async def tool_step(session: dict, tool, question: str, temperature: float = 0):
    config = {**forced(tool.__name__), "temperature": temperature}
    model = session_model(session["base_url"], session["api_key"], model_config=config)
    agent = ChatAgent(
        system_message="You are a calculator. Use the tools.",
        model=model,
        tools=[add, multiply],
        max_iteration=2,
        token_limit=8192,
    )
    return await agent.astep(question)


def test_chat_agent_episodes_are_recorded_as_trees(sqlite_proxy):
    proxy = sqlite_proxy
    talks = [("What is 7 plus 5?", "Now add 10 to that."), ("What is 6 times 7?", "Explain it in one sentence.")]
    tools = [(add, "What is 7 plus 5?", 12), (multiply, "What is 6 times 7?", 42)]
    sessions = [proxy.new_session(task_id=f"camel-{i}") for i in range(len(talks) + len(tools))]

    async def episodes():
        # all on one event loop, concurrently, as the episode runner runs them
        return await asyncio.gather(
            *(conversation(s, *t) for s, t in zip(sessions, talks)),
            *(tool_step(s, tool, q) for s, (tool, q, _) in zip(sessions[len(talks) :], tools)),
        )

    results = asyncio.run(episodes())
    for session, replies in zip(sessions, results[: len(talks)]):
        nodes = episode_nodes(proxy, session)
        assert_chain(nodes, 2)
        assert [n["response"]["content"] for n in nodes] == replies, "the agent got what was recorded"
        assert nodes[1]["messages"][-2] == {"role": "assistant", "content": replies[0]}
    for session, response, (tool, _, expected) in zip(sessions[len(talks) :], results[len(talks) :], tools):
        nodes = episode_nodes(proxy, session)
        assert_chain(nodes, 2)
        first_call = nodes[0]["response"]["tool_calls"][0]
        assert first_call["function"]["name"] == tool.__name__
        records = response.info["tool_calls"]
        assert [r.tool_call_id for r in records] == [n["response"]["tool_calls"][0]["id"] for n in nodes]
        assert records[0].result == expected, "the tool ran on the arguments the model wrote"
        echoed, tool_message = nodes[1]["messages"][-2:]
        assert echoed["tool_calls"][0]["id"] == first_call["id"]
        assert tool_message == {"role": "tool", "tool_call_id": first_call["id"], "content": str(expected)}


def test_twenty_sampled_tool_episodes(sqlite_proxy):
    """20 ChatAgent tool episodes at once, sampled at T=0.7: every call recorded as one token-exact chain."""
    proxy = sqlite_proxy
    plan = [(add if i % 2 else multiply, f"What is {10 + i} and {i % 7 + 2}?") for i in range(20)]
    sessions = [proxy.new_session(task_id=f"camel-sampled-{i}", seed=100 + i) for i in range(len(plan))]

    async def episodes():
        return await asyncio.gather(*(tool_step(s, tool, q, temperature=0.7) for s, (tool, q) in zip(sessions, plan)))

    results = asyncio.run(episodes())
    with_tools = 0
    for session, response in zip(sessions, results):
        nodes = episode_nodes(proxy, session)
        records = response.info["tool_calls"]
        assert_chain(nodes, len(nodes))
        assert len(records) <= len(nodes) <= len(records) + 1, "one call per tool turn, and the final answer"
        for record, node, child in zip(records, nodes, nodes[1:]):
            assert record.tool_call_id == node["response"]["tool_calls"][0]["id"]
            sent = [m for m in child["messages"] if m["role"] == "tool"][-1]
            assert sent["tool_call_id"] == record.tool_call_id
        with_tools += bool(records)
    assert with_tools >= len(plan) // 2, f"most forced first calls are tool calls: {with_tools} of {len(plan)}"


def test_offline_token_counter(tokenizer):
    counter = OfflineTokenCounter()
    text = "Grüße, 7 + 5 = 12"
    assert counter.decode(counter.encode(text)) == text
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": None, "tool_calls": []}]
    assert counter.count_tokens_from_messages(messages) == len(text.encode()) + 2 * 4
    exact = OfflineTokenCounter(tokenizer)
    assert exact.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert exact.decode(exact.encode(text)) == text
    assert len(exact.encode(text)) <= len(counter.encode(text)), "bytes never undercount a byte-level BPE"


@pytest.mark.parametrize("content", [[{"type": "text", "text": "abc"}, {"type": "image_url"}], "abc"])
def test_offline_counter_reads_content_parts(content):
    assert OfflineTokenCounter().count_tokens_from_messages([{"role": "user", "content": content}]) == 3 + 4
