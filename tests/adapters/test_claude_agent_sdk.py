"""The Claude Agent SDK, unchanged, against a real `areal-proxy serve` with the default model.

The SDK runs the Claude Code CLI bundled in its wheel (no network: it talks only to the proxy),
with `tools=[]` for the built-ins and the calculator example's in-process MCP tool. The CLI never
sends `tool_choice`, so the example's options carry `X-Areal-Tool-Choice`; the CLI always
streams, and `include_partial_messages` hands the raw stream events to the test. An episode is
one session; a `ClaudeSDKClient` asks two questions in it, so every call — the forced tool calls,
the turns reading their results, any turn the CLI adds after a reply cut at the output limit —
must land in one token-exact chain, with the ids the SDK saw.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("claude_agent_sdk")

from claude_agent_sdk import (  # noqa: E402 - after the skip
    AssistantMessage,
    ClaudeSDKClient,
    ResultError,
    ResultMessage,
    ToolUseBlock,
    UserMessage,
    query,
)
from claude_agent_sdk.types import StreamEvent  # noqa: E402

from examples.claude_agent_sdk.agent import options  # noqa: E402
from tests.adapters.conftest import assert_chain, episode_nodes  # noqa: E402

pytestmark = pytest.mark.agents  # also run on the newest client releases (.ci/run)

TOOL = "mcp__calc__calculate"
QUESTIONS = ["What is 47 - 18?", "What is 23 + 41?"]


async def converse(session: dict, config_dir: Path, questions: list[str]) -> list:
    """Every message the SDK yields for `questions`, asked in turn in one client."""
    opts = options(
        session["base_url"],
        session["api_key"],
        include_partial_messages=True,
        max_turns=4,
    )
    opts.env["CLAUDE_CONFIG_DIR"] = str(config_dir)
    seen: list = []
    async with ClaudeSDKClient(opts) as client:
        for question in questions:
            await client.query(question)
            try:
                async for message in client.receive_response():
                    seen.append(message)
            except ResultError as exc:  # out of turns after replies cut at the output limit
                assert exc.subtype == "error_max_turns" or any(
                    isinstance(m, AssistantMessage) and m.error == "max_output_tokens" for m in seen
                ), exc
    return seen


def message_ids(seen: list) -> list[str]:
    """The ids of the model calls the SDK saw, in order (a reply can arrive as several messages)."""
    ids: list[str] = []
    for m in seen:
        if isinstance(m, AssistantMessage) and m.message_id and m.message_id not in ids and m.model != "<synthetic>":
            ids.append(m.message_id)
    return ids


def question_of(node: dict) -> str | None:
    """The user's question when `node` is the first call answering it (the CLI may put its own system
    turn after the question), else None."""
    messages = node["messages"]
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    if any(m["role"] in ("assistant", "tool") for m in messages[last:]):
        return None
    return messages[last]["content"]


def test_claude_agent_sdk_episode_is_one_token_exact_chain(sqlite_proxy, tmp_path):
    session = sqlite_proxy.new_session(task_id="claude-agent-sdk", temperature=0)
    seen = asyncio.run(converse(session, tmp_path, QUESTIONS))

    # Streaming end to end: the CLI asked for a stream and the SDK got the proxy's raw events.
    events = [m.event["type"] for m in seen if isinstance(m, StreamEvent)]
    assert "message_start" in events and "content_block_delta" in events and "message_stop" in events

    nodes = episode_nodes(sqlite_proxy, session)
    ids = message_ids(seen)
    assert [n["id"] for n in nodes] == ids, "every call the CLI made is recorded, in order, under its id"
    assert_chain(nodes, len(ids))
    assert {n["api"] for n in nodes} == {"messages"}

    # Each question's first call was forced to the MCP tool (the header) and the SDK ran the tool.
    asked = [n for n in nodes if question_of(n) in QUESTIONS]
    assert [question_of(n) for n in asked] == QUESTIONS, "both questions went to the model"
    for node in asked:
        assert node["sampling"]["tool_choice"] == {"type": "function", "function": {"name": TOOL}}
        [call] = node["response"]["tool_calls"]
        assert call["function"]["name"] == TOOL
    uses = [b for m in seen if isinstance(m, AssistantMessage) for b in m.content if isinstance(b, ToolUseBlock)]
    results = [m for m in seen if isinstance(m, UserMessage) and m.tool_use_result is not None]
    assert len(uses) >= len(QUESTIONS) and len(results) == len(uses), "the SDK ran every call the model made"

    # A call reading a tool's result was left free, and its prompt holds the tool's exact output.
    readers = [n for n in nodes if [m for m in n["messages"] if m["role"] != "system"][-1]["role"] == "tool"]
    assert readers, "the model read at least one tool result"
    for node in readers:
        assert node["sampling"]["tool_choice"] == "auto"
        tool_message = next(m for m in reversed(node["messages"]) if m["role"] == "tool")
        assert tool_message["tool_call_id"] in {u.id for u in uses}
        assert tool_message["content"].lstrip("-").isdigit(), tool_message

    assert [m for m in seen if isinstance(m, ResultMessage)], "each question ran to the CLI's result"


def test_example_agent_runs_one_episode(sqlite_proxy, tmp_path, monkeypatch):
    """The example's `run`, as `areal-proxy train` calls it: one question, one session."""
    from examples.claude_agent_sdk.agent import run

    session = sqlite_proxy.new_session(task_id="claude-agent-sdk-run", temperature=0)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path))
    asyncio.run(run({"question": "What is 12 + 30?"}, session["base_url"], session["api_key"]))
    nodes = episode_nodes(sqlite_proxy, session)
    assert 2 <= len(nodes) <= 4, [(n["finish_reason"], n["response"]) for n in nodes]
    assert_chain(nodes, len(nodes))
    [call] = nodes[0]["response"]["tool_calls"]
    assert call["function"]["name"] == TOOL
    assert nodes[1]["messages"][-1]["role"] in ("tool", "user")


def test_query_without_header_leaves_the_model_free(sqlite_proxy, tmp_path):
    """Without the header nothing is forced: the CLI's calls are served as sent (tool_choice auto)."""
    session = sqlite_proxy.new_session(task_id="claude-agent-sdk-free", temperature=0)
    opts = options(session["base_url"], session["api_key"], max_turns=1)
    del opts.env["ANTHROPIC_CUSTOM_HEADERS"]
    opts.env["CLAUDE_CONFIG_DIR"] = str(tmp_path)

    async def ask() -> None:
        try:
            async for _ in query(prompt="Say hello.", options=opts):
                pass
        except ResultError as exc:  # out of turns, or replies cut at the output limit four times
            assert exc.subtype == "error_max_turns" or "output token maximum" in str(exc), exc

    asyncio.run(ask())
    nodes = episode_nodes(sqlite_proxy, session)
    assert nodes and all(n["sampling"]["tool_choice"] == "auto" for n in nodes)
