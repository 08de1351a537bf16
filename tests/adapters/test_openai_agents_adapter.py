"""`adapters.openai_agents`: many Agents SDK episodes in one process, each bound to its session.

Episodes in both API styles run concurrently on one event loop, each through its own
client (`session_run_config` or `session_model`); the Agent objects are shared and never
changed. Every session must hold exactly its own episode's calls, linked into one chain
with token-exact turns, in the API style it asked for, and no trace may leave the machine.
"""

from __future__ import annotations

import asyncio

import pytest
from agents import Agent, ModelSettings, Runner
from agents.tracing.processors import default_processor

from adapters.openai_agents import session_model, session_run_config
from tests.adapters.conftest import assert_chain, calculator, episode_nodes

pytestmark = pytest.mark.agents  # also run on the newest client releases (.ci/run)

AGENTS = {"add": calculator("add"), "multiply": calculator("multiply")}
# (api, binding, forced tool, question, tool output)
EPISODES = [
    ("responses", "run_config", "add", "What is 7 plus 5?", 12),
    ("chat_completions", "run_config", "multiply", "What is 6 times 7?", 42),
    ("responses", "model", "multiply", "Multiply 3 by 8.", 24),
    ("chat_completions", "model", "add", "Add 5 and 9.", 14),
]


async def episode(session: dict, api: str, binding: str, tool: str, question: str, agent: Agent | None = None):
    agent = agent or AGENTS[tool]
    base_url, key = session["base_url"], session["api_key"]
    if binding == "run_config":
        return await Runner.run(agent, question, max_turns=4, run_config=session_run_config(base_url, key, api=api))
    if binding == "streamed":
        result = Runner.run_streamed(
            agent, question, max_turns=4, run_config=session_run_config(base_url, key, api=api)
        )
        async for _ in result.stream_events():
            pass
        return result
    bound = agent.clone(model=session_model(base_url, key, api=api))
    return await Runner.run(bound, question, max_turns=4)


def test_concurrent_episodes_each_in_their_own_session(sqlite_proxy, trace_sink):
    proxy = sqlite_proxy
    sessions = [proxy.new_session(task_id=f"agents-adapter-{i}") for i in range(len(EPISODES))]

    async def episodes():
        return await asyncio.gather(*(episode(s, *e[:4]) for s, e in zip(sessions, EPISODES)))

    results = asyncio.run(episodes())
    for session, result, (api, _, tool, _, output) in zip(sessions, results, EPISODES):
        nodes = episode_nodes(proxy, session)
        assert_chain(nodes, len(result.raw_responses))
        assert len(nodes) >= 2
        assert {n["api"] for n in nodes} == {"responses" if api == "responses" else "chat"}
        [call] = nodes[0]["response"]["tool_calls"]
        assert call["function"]["name"] == tool
        assert [i.output for i in result.new_items if i.type == "tool_call_output_item"][0] == output
        if api == "responses":
            assert [r.response_id for r in result.raw_responses] == [n["id"] for n in nodes]
    default_processor().force_flush()
    assert trace_sink == [], "no trace may leave the machine"


def test_model_names_must_be_slash_free():
    with pytest.raises(ValueError, match="slash-free"):
        session_model("http://127.0.0.1:9/v1", "k", "HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ValueError, match="slash-free"):
        session_run_config("http://127.0.0.1:9/v1", "k", model="Qwen/Qwen3-8B")
    with pytest.raises(ValueError, match="chat_completions"):
        session_run_config("http://127.0.0.1:9/v1", "k", api="completions")
    config = session_run_config(
        "http://127.0.0.1:9/v1", "k", api="chat_completions", model="smollm2", workflow_name="w"
    )
    assert config.tracing_disabled and config.model == "smollm2" and config.workflow_name == "w"


def test_twenty_sampled_episodes_per_api_style(sqlite_proxy, trace_sink):
    """20 episodes in Responses mode (half streamed) and 20 in Chat Completions mode, sampled, at once.

    Sampling at T=0.7 makes some replies malformed or chatty; whatever the model wrote, every
    call the SDK made must be recorded, in one token-exact chain per episode, and every tool
    result the SDK produced must be what the next recorded call was sent.
    """
    proxy = sqlite_proxy
    plan = [("responses", "streamed" if i % 2 else "run_config") for i in range(20)]
    plan += [("chat_completions", "run_config" if i % 2 else "model") for i in range(20)]
    sessions = [proxy.new_session(task_id=f"agents-sampled-{i}", seed=100 + i) for i in range(len(plan))]
    sampled = {
        tool: agent.clone(model_settings=agent.model_settings.resolve(ModelSettings(temperature=0.7)))
        for tool, agent in AGENTS.items()
    }

    async def episodes():
        return await asyncio.gather(
            *(
                episode(
                    s,
                    api,
                    binding,
                    tool,
                    f"What is {10 + i} {'plus' if tool == 'add' else 'times'} {i % 7 + 2}?",
                    sampled[tool],
                )
                for i, (s, (api, binding)) in enumerate(zip(sessions, plan))
                for tool in ["add" if i % 2 else "multiply"]
            )
        )

    results = asyncio.run(episodes())
    tool_turns = 0
    for session, result, (api, _) in zip(sessions, results, plan):
        nodes = episode_nodes(proxy, session)
        assert_chain(nodes, len(result.raw_responses))
        assert {n["api"] for n in nodes} == {"responses" if api == "responses" else "chat"}
        if api == "responses":
            assert [r.response_id for r in result.raw_responses] == [n["id"] for n in nodes]
        outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
        if outputs:
            tool_turns += 1
            sent = [m for m in nodes[1]["messages"] if m["role"] == "tool"]
            assert sent[0]["content"] == str(outputs[0].output), "the tool result the SDK produced was sent on"
    assert tool_turns >= len(plan) // 2, f"most forced first calls are tool calls: {tool_turns} of {len(plan)}"
    default_processor().force_flush()
    assert trace_sink == [], "no trace may leave the machine"
