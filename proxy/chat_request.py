"""One model call, whichever API asked for it: the `ChatRequest` every route builds.

Types and ranges are checked by the route's wire schema (`proxy/schemas/`) before this module
sees a body; what is left are the checks that need several fields at once (a `tool_choice`
must name an offered tool, `top_logprobs` needs `logprobs`, `n` is at most `[proxy] max_n`)
and the canonical form the renderer and the store use: tools as `{type: function, function:
{name, description?, parameters?}}`, messages as `proxy.conversation.normalize_messages`
gives them. Penalties and logit_bias are accepted and not applied by the embedded engine
(listed in `ignored`). A JSON `response_format` becomes `json_schema`, which holds the reply to
the schema unless the reply may be a tool call (`reply_schema`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.conversation import normalize_messages
from proxy.engines.grammar import ANY_JSON_OBJECT, serialize
from proxy.errors import invalid_request
from proxy.parsers.base import ToolFormat
from proxy.schemas.chat import ChatCompletionRequest, NamedToolChoice

_IGNORED = ("presence_penalty", "frequency_penalty", "logit_bias", "service_tier")


@dataclass
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = True
    n: int = 1
    max_tokens: int | None = None
    clamp_max_tokens: bool = False  # a max_tokens past the context is served up to it, not refused
    reasoning: bool = True  # False: the reply opens with an empty reasoning block (families with one)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    json_schema: str | None = None  # serialized; `{"type":"object"}` for json_object
    ignored: list[str] = field(default_factory=list)

    @property
    def tool_names(self) -> set[str]:
        if self.tool_choice == "none":
            return set()
        return {t["function"]["name"] for t in self.tools}

    def required_call(self, fmt: type[ToolFormat], grammar: bool) -> tuple[str, str | None]:
        """(prefix, grammar) for `tool_choice` required or named, in the served family's format:
        the reply starts with `prefix`; with `grammar` (engines that can hold a reply to one) the
        rest is one call of the chosen tool(s) with valid arguments, else the model completes
        the opening itself. ("", None) when the reply need not be a call."""
        if not self.tools or self.tool_choice in ("auto", "none"):
            return "", None
        if isinstance(self.tool_choice, dict):
            chosen = [t for t in self.tools if t["function"]["name"] == self.tool_choice["function"]["name"]]
        else:
            chosen = self.tools
        if grammar:
            return fmt.call_grammar(chosen)
        return fmt.forced_prefix(chosen[0]["function"]["name"] if len(chosen) == 1 else None), None

    def reply_schema(self) -> str | None:
        """The schema the reply is held to: `json_schema`, unless the reply may be a tool call.

        A tool call is not JSON of the client's schema, so with tools offered and `tool_choice`
        auto the reply is left free (the tools stay callable, as without response_format), and
        with `tool_choice` required or named, where the reply must be a call, a JSON
        response_format is refused.
        """
        if self.json_schema is None or not self.tool_names:
            return self.json_schema
        if self.tool_choice != "auto":
            raise invalid_request(
                f"a JSON response_format with tool_choice {json.dumps(self.tool_choice)} is not supported: "
                "the reply must be a tool call",
                "response_format",
            )
        return None

    def text_size(self) -> int:
        """Characters of message text, tool-call arguments and tool schemas: what rendering costs."""
        size = sum(len(m.get("content") or "") for m in self.messages)
        size += sum(len(c["function"]["arguments"]) for m in self.messages for c in m.get("tool_calls") or ())
        return size + (len(orjson.dumps(self.tools)) if self.tools else 0)

    def sampling(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
            "ignore_eos": self.ignore_eos,
            "n": self.n,
            "tool_choice": self.tool_choice,
            **({"json_schema": self.reply_schema()} if self.reply_schema() else {}),
        }


def reply_json_schema(kind: str | None, schema: dict[str, Any] | None, param: str) -> str | None:
    """The serialized schema a response format of type `kind` asks for (None: plain text).
    `param` names where the schema belongs, for the 400 when it is missing."""
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return ANY_JSON_OBJECT
    if schema is None:
        raise invalid_request(f"{param} is required with type json_schema", param)
    return serialize(schema)


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A tool in the canonical form the renderer and the store use."""
    fn: dict[str, Any] = {"name": name}
    if description is not None:
        fn["description"] = description
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def tool_choice(choice: str | None, named: str | None, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """`auto`, `none`, `required` or `{type: function, function: {name}}` for a tool in `tools`."""
    if named is not None:
        if named not in {t["function"]["name"] for t in tools}:
            raise invalid_request(f"tool_choice names {named!r}, which is not in tools", "tool_choice")
        return {"type": "function", "function": {"name": named}}
    if choice == "required" and not tools:
        raise invalid_request("tool_choice 'required' needs tools", "tool_choice")
    return choice or "auto"


TOOL_CHOICE_HEADER = "x-areal-tool-choice"
_HEADER_CHOICES = {"auto": "auto", "none": "none", "required": "required", "any": "required"}


def header_tool_choice(chat: ChatRequest, header: str | None, body_chose: bool) -> None:
    """Apply the `X-Areal-Tool-Choice` header: a tool choice for clients that never send one (the
    Claude Code CLI behind the Claude Agent SDK). Its value is `auto`, `none`, `required` (or
    `any`) or a tool's name. It holds only where the body chose nothing, the request offers tools,
    and the turn is the user's: the last message other than a system one is a user message. A
    request ending on a tool result is left on `auto`, so the model can read the result and answer,
    as the Agents SDK resets a forced choice after the call it forced."""
    if header is None or body_chose or not chat.tools:
        return
    value = header.strip()
    if not value:
        raise invalid_request("X-Areal-Tool-Choice must not be empty", "X-Areal-Tool-Choice")
    last = next((m["role"] for m in reversed(chat.messages) if m["role"] != "system"), None)
    if last != "user":
        return
    names = {t["function"]["name"] for t in chat.tools}
    if value in _HEADER_CHOICES and value not in names:
        chat.tool_choice = _HEADER_CHOICES[value]
    elif value in names:
        chat.tool_choice = tool_choice(None, value, chat.tools)
    else:
        raise invalid_request(
            f"X-Areal-Tool-Choice {value!r} is neither auto, none, required, any nor a tool in this request "
            f"(tools: {', '.join(sorted(names))})",
            "X-Areal-Tool-Choice",
        )


def chat_request(body: ChatCompletionRequest, max_n: int) -> ChatRequest:
    """A validated Chat Completions body as the request every API shares."""
    if body.n is not None and body.n > max_n:
        raise invalid_request(f"n must be at most {max_n} on this server, got {body.n}", "n", "invalid_value")
    if body.top_logprobs and not body.logprobs:
        raise invalid_request("top_logprobs needs logprobs: true", "top_logprobs")
    tools = [function_tool(t.function.name, t.function.description, t.function.parameters) for t in body.tools or ()]
    choice = body.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    stop = body.stop
    fmt = body.response_format
    spec = fmt.json_schema if fmt is not None else None
    return ChatRequest(
        model=body.model,
        messages=normalize_messages([m.model_dump(exclude_none=True) for m in body.messages]),
        stream=body.stream,
        n=body.n or 1,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(0, body.top_k or 0),
        seed=body.seed,
        stop=[stop] if isinstance(stop, str) else list(stop or ()),
        ignore_eos=bool(body.ignore_eos),
        logprobs=bool(body.logprobs),
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
        tools=tools,
        tool_choice=tool_choice(None if named else choice, named, tools),
        json_schema=reply_json_schema(fmt and fmt.type, spec and spec.schema_, "response_format.json_schema.schema"),
        ignored=[k for k in _IGNORED if getattr(body, k) is not None],
    )
