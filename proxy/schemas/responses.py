"""`POST /v1/responses` bodies, as the OpenAI Agents SDK and the `openai` client send them.

Input is a string or items: `message` (role user, system, developer or assistant; text
content), `function_call`, `function_call_output` and `reasoning`; other item types (images,
files, built-in tool calls) are refused by name. Tools are flat function tools; built-in tools
(web search, file search, computer use) are refused by name. `text.format` is honoured (text,
`json_object`, `json_schema`). Other fields the SDK sends (`store`, `metadata`, `truncation`,
`reasoning`, …) are accepted; unknown ones ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from proxy.schemas.chat import TextPart
from proxy.schemas.common import (
    MAX_MESSAGES,
    MAX_PARTS,
    MAX_TOOLS,
    Id,
    JsonObject,
    JsonValue,
    Seed,
    TokenCount,
    TopLogprobs,
    TopP,
    Wire,
)

ItemType = Literal["message", "function_call", "function_call_output", "reasoning"]
Texts = Annotated[list[TextPart | str], Field(max_length=MAX_PARTS)]


class ReasoningText(Wire):
    type: Annotated[str, Field(max_length=64)] | None = None
    text: str | None = None


class InputItem(Wire):
    """One input item; which fields apply depends on `type` (a message may omit it and give `role`)."""

    type: ItemType | None = None
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | Texts | Annotated[list[ReasoningText], Field(max_length=MAX_PARTS)] | None = None
    """A message's text; a reasoning item's full text parts."""
    id: Annotated[str, Field(max_length=256)] | None = None
    call_id: Id | None = None
    name: Annotated[str, Field(max_length=256)] | None = None
    arguments: str | None = None
    """A function call's arguments: a JSON string, echoed verbatim."""
    output: str | Texts | None = None
    """A function call's result."""
    summary: Annotated[list[ReasoningText], Field(max_length=MAX_PARTS)] | None = None
    status: Annotated[str, Field(max_length=64)] | None = None


class ResponsesTool(Wire):
    type: Literal["function"]
    """Function tools only; built-in tools are not served by this proxy."""
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class NamedFunctionChoice(Wire):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=256)]


class TextFormat(Wire):
    """`text.format`: plain text, any JSON object, or JSON matching `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(max_length=256)] | None = None
    description: str | None = None
    schema_: Annotated[JsonObject | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponsesText(Wire):
    format: TextFormat | None = None
    verbosity: Annotated[str, Field(max_length=32)] | None = None


class ResponsesRequest(Wire):
    model: Annotated[str, Field(max_length=256)] = ""
    input: str | Annotated[list[InputItem], Field(max_length=MAX_MESSAGES)] | None = None
    instructions: str | None = None
    previous_response_id: Id | None = None
    conversation: JsonValue | None = None
    """Not supported: resend the items or use previous_response_id."""
    stream: bool = False
    max_output_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: TopP | None = None
    top_logprobs: TopLogprobs | None = None
    seed: Seed | None = None
    ignore_eos: bool | None = None
    """vLLM's extension: generate past the end-of-sequence token, up to max_output_tokens."""
    include: Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=64)] | None = None
    tools: Annotated[list[ResponsesTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: JsonObject | None = None
    store: bool | None = None
    truncation: Annotated[str, Field(max_length=64)] | None = None
    reasoning: JsonObject | None = None
    text: ResponsesText | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
