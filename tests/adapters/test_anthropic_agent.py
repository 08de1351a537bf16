"""A tool-using agent on the real `anthropic` client, over several episodes, through the proxy.

The agent loop is the one from Anthropic's tool-use guide: call with tools, run each
`tool_use` block, send `tool_result` blocks back, until the model answers in text. Its
base URL is the session's without `/v1`, as the runner puts it in ANTHROPIC_BASE_URL.
Each episode (some streamed) must be recorded as one chain whose turns extend their
parent's exact tokens, with the ids the client saw.
"""

from __future__ import annotations

import asyncio

import anthropic
import pytest

from tests.adapters.conftest import assert_chain, episode_nodes

pytestmark = pytest.mark.agents  # also run on the newest client releases (.ci/run)

SYSTEM = "You are a calculator. Use the tools, then state the result."
TOOLS = [
    {
        "name": name,
        "description": f"{name.capitalize()} two integers.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
    for name in ("add", "multiply")
]
RUN = {"add": lambda a, b: a + b, "multiply": lambda a, b: a * b}
# (tool named on the first call, question, expected tool result, streamed?)
EPISODES = [
    ("add", "What is 7 plus 5?", "12", False),
    ("multiply", "Multiply 6 by 7.", "42", True),
    ("add", "Add 5 and 9.", "14", True),
]
# Greedy replies are fixed, but a forced call can still come out malformed (it is then plain
# text and the loop ends): every episode must be a well-formed chain, most must reach a tool turn.
MIN_TOOL_EPISODES = 2


def run_tool(block) -> dict:
    """A tool_result block; arguments the model got wrong go back as an error, as a real agent does."""
    try:
        return {"type": "tool_result", "tool_use_id": block.id, "content": str(RUN[block.name](**block.input))}
    except (KeyError, TypeError) as exc:
        return {"type": "tool_result", "tool_use_id": block.id, "content": repr(exc), "is_error": True}


async def create(client: anthropic.AsyncAnthropic, streamed: bool, **kwargs) -> anthropic.types.Message:
    if not streamed:
        return await client.messages.create(**kwargs)
    async with client.messages.stream(**kwargs) as stream:
        async for _ in stream:
            pass
        return await stream.get_final_message()


async def episode(
    session: dict, tool: str, question: str, streamed: bool, temperature: float = 0
) -> list[anthropic.types.Message]:
    base_url = session["base_url"].removesuffix("/v1")
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=session["api_key"], max_retries=0)
    messages: list[dict] = [{"role": "user", "content": question}]
    tool_choice = {"type": "tool", "name": tool}
    replies = []
    try:
        for _ in range(3):
            reply = await create(
                client,
                streamed,
                model="claude-sonnet-4-5",
                system=SYSTEM,
                messages=messages,
                tools=TOOLS,
                tool_choice=tool_choice,
                max_tokens=26,
                extra_body={"temperature": temperature},
            )
            replies.append(reply)
            if reply.stop_reason != "tool_use":
                break
            results = [run_tool(b) for b in reply.content if b.type == "tool_use"]
            messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": results}]
            tool_choice = {"type": "auto"}
    finally:
        await client.close()
    return replies


def test_tool_episodes_are_recorded_as_trees(sqlite_proxy):
    proxy = sqlite_proxy
    sessions = [proxy.new_session(task_id=f"anthropic-{i}") for i in range(len(EPISODES))]

    async def episodes():
        return await asyncio.gather(*(episode(s, t, q, st) for s, (t, q, _, st) in zip(sessions, EPISODES)))

    results = asyncio.run(episodes())
    assert sum(len(replies) >= 2 for replies in results) >= MIN_TOOL_EPISODES, [r[0].content for r in results]
    for session, replies, (tool, _, output, _) in zip(sessions, results, EPISODES):
        nodes = episode_nodes(proxy, session)
        assert_chain(nodes, len(replies))
        assert [n["id"] for n in nodes] == [r.id for r in replies], "every call the client made is recorded"
        assert {n["api"] for n in nodes} == {"messages"}
        if len(replies) == 1:
            assert replies[0].content[0].text == nodes[0]["response"]["content"]
            continue
        [use] = [b for b in replies[0].content if b.type == "tool_use"]
        [call] = nodes[0]["response"]["tool_calls"]
        assert use.name == tool and use.id == call["id"]
        assert nodes[1]["messages"][-1] == {"role": "tool", "tool_call_id": use.id, "content": output}
        assert nodes[1]["sampling"]["tool_choice"] == "auto"
        final = replies[-1]
        if final.stop_reason != "tool_use":
            text = "".join(b.text for b in final.content if b.type == "text")
            assert nodes[-1]["response"]["content"] == text


def test_twenty_sampled_episodes(sqlite_proxy):
    """20 episodes at once, half streamed, sampled at T=0.7: every call recorded as one token-exact chain."""
    proxy = sqlite_proxy
    plan = [("add" if i % 2 else "multiply", f"What is {10 + i} and {i % 7 + 2}?", i % 2 == 0) for i in range(20)]
    sessions = [proxy.new_session(task_id=f"anthropic-sampled-{i}", seed=100 + i) for i in range(len(plan))]

    async def episodes():
        return await asyncio.gather(*(episode(s, *p, temperature=0.7) for s, p in zip(sessions, plan)))

    results = asyncio.run(episodes())
    for session, replies in zip(sessions, results):
        nodes = episode_nodes(proxy, session)
        assert_chain(nodes, len(replies))
        assert [n["id"] for n in nodes] == [r.id for r in replies], "every call the client made is recorded"
        for reply, child in zip(replies, nodes[1:]):  # a reply is followed by a call only after tool_use
            uses = [b.id for b in reply.content if b.type == "tool_use"]
            sent = [m["tool_call_id"] for m in child["messages"] if m["role"] == "tool"]
            assert uses and sent[-len(uses) :] == uses, "each tool_result went back on its id"
    went_on = sum(len(r) >= 2 for r in results)
    assert went_on >= len(plan) // 2, f"most forced first calls are tool calls: {went_on} of {len(plan)}"
