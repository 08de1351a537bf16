"""A calculator agent written with the Claude Agent SDK, trained on two-digit arithmetic.

Ordinary Claude Agent SDK code: a `calculate` tool served by an in-process MCP server
(`@tool` + `create_sdk_mcp_server`) and a `query()` loop; the SDK runs the Claude Code CLI bundled
in its wheel, which talks the Messages API to whatever `ANTHROPIC_BASE_URL` names. The only
lines that know about training are in `options()`: the session's URL and key, and the
`X-Areal-Tool-Choice` header, because the CLI never sends `tool_choice` and the small default
model will not call a tool by itself. The proxy forces the call on the turn that starts from the
question and leaves the model free on the turn that reads the tool's result, which states the
answer that the `calculator` reward grades.

The tool's schema allows one operation on two integers, so the forced call is well formed (the
proxy holds it to the schema); which numbers go in, and stating the result, is what the model
learns.
"""

from __future__ import annotations

import operator
import re
from typing import Any

from claude_agent_sdk import AssistantMessage, ClaudeAgentOptions, ResultError, create_sdk_mcp_server, query, tool

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
# One binary operation on two integers of up to four digits: the proxy holds a forced call to
# this schema, so every call parses (and none can ask for 9**9**9).
EXPRESSION = re.compile(r"^(-?[0-9]{1,4}) *([-+*]) *(-?[0-9]{1,4})$")
SCHEMA = {
    "type": "object",
    "properties": {"expression": {"type": "string", "pattern": EXPRESSION.pattern}},
    "required": ["expression"],
    "additionalProperties": False,
}
SYSTEM = "You are a calculator. Call the calculate tool with the expression, then reply: The answer is <result>."
# A turn is at most 64 tokens and an episode at most two model calls: the forced tool call, then
# the answer. A reply cut at 64 tokens ends the episode (the CLI's next turn would be over the
# limit); the reward then finds no answer.
MAX_TOKENS = 64
MAX_TURNS = 2


@tool("calculate", "Compute an expression of two integers: a + b, a - b or a * b.", SCHEMA)
async def calculate(args: dict[str, Any]) -> dict[str, Any]:
    match = EXPRESSION.match(args["expression"].strip())
    if match is None:
        return {"content": [{"type": "text", "text": "not an expression of two integers"}], "is_error": True}
    a, op, b = match.groups()
    return {"content": [{"type": "text", "text": str(OPERATIONS[op](int(a), int(b)))}]}


def options(base_url: str, api_key: str, **overrides: Any) -> ClaudeAgentOptions:
    """The agent's options, pointed at a proxy session (`base_url` ends in /v1, as the runner gives it)."""
    settings: dict[str, Any] = {
        "system_prompt": SYSTEM,
        "tools": [],  # no built-in tools: their definitions alone overflow a small model's context
        "setting_sources": [],  # no CLAUDE.md or settings files in the prompt
        "mcp_servers": {"calc": create_sdk_mcp_server("calc", tools=[calculate])},
        "allowed_tools": ["mcp__calc__calculate"],
        "max_turns": MAX_TURNS,
        "extra_args": {"no-session-persistence": None},  # no transcript per episode under ~/.claude
        "env": {
            "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": api_key,
            "ANTHROPIC_CUSTOM_HEADERS": "X-Areal-Tool-Choice: mcp__calc__calculate",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_TOKENS),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
        },
    }
    return ClaudeAgentOptions(**{**settings, **overrides})


async def run(task: dict, base_url: str, api_key: str) -> None:
    """One episode. Running out of turns, or the CLI giving up on replies cut at MAX_TOKENS, is an
    ordinary end: the reward grades what was said. Any other error the CLI reports fails the episode."""
    cut = False
    try:
        async for message in query(prompt=task["question"], options=options(base_url, api_key)):
            cut = cut or (isinstance(message, AssistantMessage) and message.error == "max_output_tokens")
    except ResultError as exc:
        if exc.subtype != "error_max_turns" and not cut:
            raise
