"""`POST /v1/chat/completions` bodies, as OpenAI clients send them.

Field names and ranges are OpenAI's (temperature 0–2, top_p in (0, 1], top_logprobs ≤ 20,
`max_tokens` or `max_completion_tokens`), plus the `top_k` extension vLLM and SGLang accept.
Content is text: a string, null, or text parts; any other part type is refused by name.
`response_format` is honoured (text, `json_object`, `json_schema`: see docs/structured-output.md).
Penalties, `logit_bias` and `service_tier` are accepted and not applied (the embedded engine
samples without them); other unknown fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from proxy.schemas.common import (
    MAX_CALLS,
    MAX_MESSAGES,
    MAX_PARTS,
    MAX_TOOLS,
    Id,
    JsonObject,
    JsonValue,
    Name,
    Seed,
    Stop,
    TokenCount,
    TopK,
    TopLogprobs,
    TopP,
    Wire,
)

TextPartType = Literal["text", "input_text", "output_text", "refusal"]


class TextPart(Wire):
    type: TextPartType
    """Text parts only; images, audio and files are refused."""
    text: str | None = None
    refusal: str | None = None


Content = str | Annotated[list[TextPart | str], Field(max_length=MAX_PARTS)] | None


class FunctionCall(Wire):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    arguments: str | JsonObject = ""
    """A JSON string as OpenAI sends it (an object is serialized)."""


class ToolCall(Wire):
    id: Id
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content = None
    name: Name | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_CALLS)] | None = None
    """Assistant messages: the calls it made."""
    tool_call_id: Id | None = None
    """Tool messages: the call answered."""
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionSpec(Wire):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class Tool(Wire):
    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedFunction(Wire):
    name: Annotated[str, Field(min_length=1, max_length=256)]


class NamedToolChoice(Wire):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class JsonSchemaSpec(Wire):
    name: Annotated[str, Field(max_length=256)] | None = None
    description: str | None = None
    schema_: Annotated[JsonObject | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponseFormat(Wire):
    """Plain text, any JSON object, or JSON matching `json_schema.schema`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StreamOptions(Wire):
    include_usage: bool | None = None


class ChatCompletionRequest(Wire):
    model: Annotated[str, Field(max_length=256)] = ""
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    """Choices; at most `[proxy] max_n`."""
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    """-1 or 0: off."""
    seed: Seed | None = None
    stop: Stop = None
    ignore_eos: bool | None = None
    """vLLM's extension: generate past the end-of-sequence token, up to max_tokens (benchmarks)."""
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=1024)] | None = None
    response_format: ResponseFormat | None = None
    service_tier: Annotated[str, Field(max_length=64)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    metadata: JsonObject | None = None
    store: bool | None = None
    extra_body: JsonValue | None = None
