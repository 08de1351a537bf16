"""An unchanged OpenAI Agents SDK agent, pointed at the proxy by environment alone.

Each episode is its own session (its key is the episode's `OPENAI_API_KEY`), runs with
`Runner.run` or `Runner.run_streamed`, in the SDK's default Responses mode and in Chat
Completions mode. Every model call must be recorded and linked into one tree per
episode, each turn extending its parent's exact tokens, and no trace may leave the
machine. The 135M model only calls tools reliably when forced, so the agent names its
tool in `ModelSettings.tool_choice`, which the SDK applies to the first call only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from agents import Agent, Runner, set_default_openai_api
from agents.tracing.processors import default_processor

from tests.adapters.conftest import calculator

pytestmark = pytest.mark.agents  # also run on the newest client releases (.ci/run)

# (forced tool, question, expected tool output, streamed?)
EPISODES = [
    ("add", "What is 7 plus 5?", "12", False),
    ("multiply", "What is 6 times 7?", "42", True),
    ("add", "Add 5 and 9.", "14", True),
    ("multiply", "Multiply 3 by 8.", "24", False),
]


@pytest.fixture(scope="module")
def event_loop_for_sdk() -> Iterator[asyncio.AbstractEventLoop]:
    """One loop for every run: the SDK shares one HTTP client per process, bound to the first loop."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


async def run_episode(agent: Agent, question: str, streamed: bool):
    if not streamed:
        return await Runner.run(agent, question, max_turns=4)
    result = Runner.run_streamed(agent, question, max_turns=4)
    async for _ in result.stream_events():
        pass
    return result


def check_episode(proxy, session: dict, result, api: str, tool: str, tool_output: str) -> None:
    nodes = sorted(proxy.session(session["session_id"])["completions"], key=lambda n: n["depth"])
    assert len(nodes) == len(result.raw_responses) >= 2, "every model call is recorded"
    assert {n["api"] for n in nodes} == {api}
    assert nodes[0]["parent_id"] is None
    for parent, child in zip(nodes, nodes[1:]):
        assert child["parent_id"] == parent["id"], "one chain per episode"
        full = parent["prompt_ids"] + parent["output_ids"]
        assert (child["prompt_ids"] + child["output_ids"])[: len(full)] == full, "token-exact continuation"
    if api == "responses":
        assert [r.response_id for r in result.raw_responses] == [n["id"] for n in nodes]
    [call] = nodes[0]["response"]["tool_calls"]
    assert call["function"]["name"] == tool
    tool_message = nodes[1]["messages"][-1]
    assert tool_message == {"role": "tool", "tool_call_id": call["id"], "content": tool_output}
    assert nodes[1]["sampling"]["tool_choice"] == "auto", "the SDK forces the tool on the first call only"
    assert [i.output for i in result.new_items if i.type == "tool_call_output_item"][0] == int(tool_output)
    assert isinstance(result.final_output, str)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_unchanged_agent_episodes_are_recorded_as_trees(sqlite_proxy, monkeypatch, trace_sink, event_loop_for_sdk, api):
    proxy = sqlite_proxy
    monkeypatch.setenv("OPENAI_BASE_URL", proxy.base_url)
    sessions = [proxy.new_session(task_id=f"agents-{api}-{i}") for i in range(len(EPISODES))]

    async def episodes() -> list:
        results = []
        for session, (tool, question, _, streamed) in zip(sessions, EPISODES):
            monkeypatch.setenv("OPENAI_API_KEY", session["api_key"])
            results.append(await run_episode(calculator(tool), question, streamed))
        return results

    if api == "chat":
        set_default_openai_api("chat_completions")
    try:
        results = event_loop_for_sdk.run_until_complete(episodes())
    finally:
        set_default_openai_api("responses")
    for session, result, (tool, _, output, _) in zip(sessions, results, EPISODES):
        check_episode(proxy, session, result, api, tool, output)
    default_processor().force_flush()
    assert trace_sink == [], "no trace may leave the machine"
