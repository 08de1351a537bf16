"""A LangGraph agent on LangChain's `ChatOpenAI` through the proxy, streamed and not.

The agent is the one in `examples/langgraph`: a StateGraph of a model node and a
`ToolNode`, its first call forced to the `calculate` tool (`tool_choice`, which the
135M model needs), the second free, the third told to answer. Each episode is its own
session, all run at once on one event loop. Every model call must be recorded as one
chain per episode, each turn extending its parent's exact tokens, holding what
LangChain returned to the graph: the ids, the tool calls and their arguments, the text
(which the stored sampled tokens decode to) and the token counts.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_openai import ChatOpenAI

from adapters.tasks import load_object
from tests.adapters.conftest import assert_chain, episode_nodes
from tests.conftest import REPO

pytestmark = pytest.mark.agents

calculator = load_object(f"{REPO}/examples/langgraph/agent.py:calculator")
TOOL_CHOICE = load_object(f"{REPO}/examples/langgraph/agent.py:TOOL_CHOICE")
# (question, streamed?)
EPISODES = [("What is 47 - 18?", False), ("What is 23 + 45?", True), ("What is 91 - 71?", True)]


async def episode(
    session: dict, question: str, streamed: bool, temperature: float = 0, seed: int | None = None
) -> list[BaseMessage]:
    llm = ChatOpenAI(
        model="smollm2-135m-instruct",
        base_url=session["base_url"],
        api_key=session["api_key"],
        temperature=temperature,
        seed=seed,
        max_tokens=26,
        max_retries=0,
        streaming=streamed,
        stream_usage=True,  # the last chunk carries the token counts, as a whole reply does
    )
    state = await calculator(llm).ainvoke({"messages": [("user", question)]})
    return state["messages"]


def check_episode(proxy, session: dict, messages: list[BaseMessage], tokenizer) -> list[dict]:
    """The session's recorded chain is the graph's model calls, each holding what the graph got back."""
    replies = [m for m in messages if isinstance(m, AIMessage)]
    nodes = episode_nodes(proxy, session)
    assert_chain(nodes, len(replies))
    usage = [(r.usage_metadata["input_tokens"], r.usage_metadata["output_tokens"]) for r in replies]
    assert [(len(n["prompt_ids"]), len(n["output_ids"])) for n in nodes] == usage, "the tokens the client was told of"
    if "id" in replies[0].response_metadata:  # streamed replies carry LangChain's run ids instead
        assert [n["id"] for n in nodes] == [r.response_metadata["id"] for r in replies]
    assert [n["sampling"]["tool_choice"] for n in nodes][1:] == list(TOOL_CHOICE[1 : len(nodes)])
    results = {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}
    for reply, node, child in zip(replies, nodes, [*nodes[1:], None]):
        calls = node["response"].get("tool_calls") or []
        recorded = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        assert recorded == [(c["id"], c["name"], c["args"]) for c in reply.tool_calls], "the calls the graph ran"
        if not calls:
            assert node["response"]["content"] == reply.content
            # the text the graph got is the sampled tokens, after a forced call's opening (which is the prompt's)
            sampled = tokenizer.decode(node["output_ids"]).removesuffix(tokenizer.eos_token).strip()
            full = tokenizer.decode(node["prompt_ids"] + node["output_ids"]).removesuffix(tokenizer.eos_token)
            assert sampled and reply.content.strip().endswith(sampled), "the stored tokens are the text the graph got"
            assert full.rstrip().endswith(reply.content.strip())
        if child is not None:  # the graph goes on only after tool calls, and sends each result back on its id
            sent = [(m["tool_call_id"], m["content"]) for m in child["messages"] if m["role"] == "tool"]
            assert calls and sent[-len(calls) :] == [(c["id"], results[c["id"]]) for c in reply.tool_calls]
    return nodes


def test_graph_episodes_are_recorded_as_chains(sqlite_proxy, tokenizer):
    proxy = sqlite_proxy
    sessions = [proxy.new_session(task_id=f"langgraph-{i}") for i in range(len(EPISODES))]

    async def episodes():
        return await asyncio.gather(*(episode(s, q, streamed) for s, (q, streamed) in zip(sessions, EPISODES)))

    results = asyncio.run(episodes())
    for session, messages in zip(sessions, results):
        nodes = check_episode(proxy, session, messages, tokenizer)
        assert len(nodes) >= 2, "the forced first call is a tool call, so the graph calls the model again"
        [call] = nodes[0]["response"]["tool_calls"]
        assert call["function"]["name"] == "calculate"
        assert nodes[0]["sampling"]["tool_choice"] == {"type": "function", "function": {"name": "calculate"}}


def test_twelve_sampled_episodes(sqlite_proxy, tokenizer):
    """12 episodes at once, half streamed, sampled at T=0.7: each a token-exact chain of what the graph got.
    Each episode has its own seed, so that what it samples does not depend on which others share its
    batches (unseeded, how many first calls ended in a call varied from run to run)."""
    proxy = sqlite_proxy
    plan = [(f"What is {10 + i} {'+' if i % 2 else '-'} {i % 7 + 2}?", i % 2 == 0) for i in range(12)]
    sessions = [proxy.new_session(task_id=f"langgraph-sampled-{i}") for i in range(len(plan))]

    async def episodes():
        runs = (episode(s, q, st, 0.7, seed=100 + i) for i, (s, (q, st)) in enumerate(zip(sessions, plan, strict=True)))
        return await asyncio.gather(*runs)

    results = asyncio.run(episodes())
    lengths = [len(check_episode(proxy, session, messages, tokenizer)) for session, messages in zip(sessions, results)]
    assert sum(n >= 2 for n in lengths) >= len(plan) // 2, f"most forced first calls are tool calls: {lengths}"
