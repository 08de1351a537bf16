"""`POST /v1/messages` bodies, as the `anthropic` client sends them.

Anthropic's ranges: `max_tokens` required, temperature 0–1, `top_k` ≥ 0, at most 16
`stop_sequences`. Content is a string or blocks: `text`, `tool_use`, `tool_result` (its content
a string or text blocks), `thinking` and `redacted_thinking`; images and documents are refused
by name. A `system` entry inside `messages` (Claude Code sends one after the first user turn) is
a system turn in place. Tools are custom tools with an `input_schema`; server tools (a `type`
such as `web_search_20250305`) are parsed so that the route can refuse them by name. Structured
outputs (`output_config.format`, or the beta's `output_format`: type `json_schema`) hold the
reply to a schema. `thinking` is `enabled` (with `budget_tokens`), `adaptive` or `disabled`.
`metadata`, `output_config.effort`, `context_management`, `cache_control` and other fields
clients send are accepted; unknown ones ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from proxy.schemas.common import (
    MAX_MESSAGES,
    MAX_PARTS,
    MAX_TOOLS,
    Id,
    JsonObject,
    StopString,
    TokenCount,
    TopP,
    Wire,
)


class Block(Wire):
    """One content block; which fields apply depends on `type`."""

    type: Annotated[str, Field(max_length=64)]
    """`text`, `tool_use`, `tool_result`, `thinking`, `redacted_thinking`; the route refuses any other by name."""
    text: str | None = None
    id: Id | None = None
    """tool_use: the call's id."""
    name: Annotated[str, Field(max_length=256)] | None = None
    input: JsonObject | None = None
    """tool_use: the call's arguments."""
    tool_use_id: Id | None = None
    """tool_result: the call answered."""
    content: str | Annotated[list[Block], Field(max_length=MAX_PARTS)] | None = None
    """tool_result: its output, a string or text blocks."""
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    cache_control: JsonObject | None = None


class Message(Wire):
    role: Literal["user", "assistant", "system"]
    content: str | Annotated[list[Block], Field(max_length=MAX_PARTS)]


class SystemBlock(Wire):
    type: Literal["text"]
    text: str
    cache_control: JsonObject | None = None


class CustomTool(Wire):
    type: Annotated[str, Field(max_length=128)] | None = None
    """`custom` (or absent); any other type is a server tool (web search, code execution), refused."""
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
    description: str | None = None
    input_schema: JsonObject | None = None
    """Required of custom tools; server tools have none."""
    defer_loading: bool | None = None
    """Tool search's deferred tools: left out of the prompt until the client sends them undeferred."""
    cache_control: JsonObject | None = None


class ToolChoice(Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: Annotated[str, Field(max_length=256)] | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(Wire):
    """Structured outputs: the reply is JSON matching `schema`."""

    type: Literal["json_schema"]
    schema_: Annotated[JsonObject, Field(alias="schema")]


class OutputConfig(Wire):
    format: OutputFormat | None = None
    effort: Annotated[str, Field(max_length=64)] | None = None
    """`low` … `max`: accepted, not applied (the served model has no effort setting)."""


class Thinking(Wire):
    type: Literal["enabled", "adaptive", "disabled"]
    """`disabled` opens the reply with an empty reasoning block (models with one); else it reasons freely."""
    budget_tokens: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    """Accepted, not enforced: the reply's reasoning counts against max_tokens."""
    display: Annotated[str, Field(max_length=64)] | None = None


class MessagesRequest(Wire):
    model: Annotated[str, Field(max_length=256)] = ""
    max_tokens: TokenCount
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: str | Annotated[list[SystemBlock], Field(max_length=MAX_PARTS)] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    stop_sequences: Annotated[list[StopString], Field(max_length=16)] | None = None
    ignore_eos: bool | None = None
    """vLLM's extension: generate past the end-of-sequence token, up to max_tokens."""
    tools: Annotated[list[CustomTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    metadata: JsonObject | None = None
    thinking: Thinking | None = None
    context_management: JsonObject | None = None
    """Accepted, not applied: the client's messages are the prompt as sent."""
    output_format: OutputFormat | None = None
    """The structured-outputs beta's spelling of `output_config.format`."""
    output_config: OutputConfig | None = None
    service_tier: Annotated[str, Field(max_length=64)] | None = None


class CountTokensRequest(MessagesRequest):
    """`POST /v1/messages/count_tokens`: a Messages body; nothing is sampled, so no `max_tokens`."""

    max_tokens: TokenCount | None = None
