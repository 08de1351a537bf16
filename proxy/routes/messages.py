"""`POST /v1/messages` (also under `/sessions/{id}/v1/`): Anthropic's Messages API.

Anthropic clients talk to the same recorded, token-exact model calls: `system`,
text / `tool_use` / `tool_result` blocks and `{name, input_schema}` tools become
canonical chat messages for `CompletionService`. A `tool_use` block's id is the
recorded tool-call id, and its `input` is the recorded arguments string parsed;
when the client sends the block back, `input` is serialized the way the reply
parser wrote it, so the echoed turn hashes to its node. Errors on this route use
Anthropic's shape `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from proxy.chat_request import (
    TOOL_CHOICE_HEADER,
    ChatRequest,
    function_tool,
    header_tool_choice,
    reply_json_schema,
    tool_choice,
)
from proxy.completions import ChoiceDelta, ChoiceResult, Turn
from proxy.config import ProxyConfig
from proxy.conversation import normalize_messages
from proxy.errors import APIError, invalid_request
from proxy.routes.common import EventStream, JsonRoute, anthropic_type, json_response, unless_disconnected
from proxy.routes.deps import CallerDep, Completions, State, model_call
from proxy.schemas.messages import Block, CountTokensRequest, MessagesRequest

router = APIRouter(route_class=JsonRoute)


# -- request: blocks → chat messages ---------------------------------------------------
def _blocks(content: str | list[Block]) -> list[Block]:
    return [Block(type="text", text=content)] if isinstance(content, str) else content


def _text(block: Block, p: str) -> str:
    if block.text is None:
        raise invalid_request(f"{p}.text is required", f"{p}.text")
    return block.text


def _tool_result_text(block: Block, p: str) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    texts = []
    for j, part in enumerate(block.content):
        if part.type != "text":
            raise invalid_request(f"{p}.content[{j}].type {part.type!r} is not supported (text only)", f"{p}.content")
        texts.append(_text(part, f"{p}.content[{j}]"))
    return "\n".join(texts)


def _user_messages(blocks: list[Block], p: str, tool_use_ids: set[str]) -> list[dict[str, Any]]:
    """Tool results become tool messages; runs of text blocks become user messages, in order."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        q = f"{p}[{j}]"
        if block.type == "text":
            texts.append(_text(block, q))
        elif block.type == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            if block.tool_use_id not in tool_use_ids:
                raise invalid_request(
                    f"{q}.tool_use_id {block.tool_use_id!r} matches no tool_use block of an earlier assistant turn",
                    f"{q}.tool_use_id",
                )
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _tool_result_text(block, q)})
        else:
            raise invalid_request(f"{q}.type {block.type!r} is not supported in user turns", f"{q}.type")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant_message(blocks: list[Block], p: str) -> dict[str, Any]:
    texts, calls, thinking = [], [], []
    for j, block in enumerate(blocks):
        q = f"{p}[{j}]"
        if block.type == "text":
            texts.append(_text(block, q))
        elif block.type == "tool_use":
            if block.id is None or block.name is None:
                raise invalid_request(f"{q} needs an id and a name", q)
            # The reply parser's serialization: the echoed input reproduces the recorded arguments string.
            arguments = json.dumps(block.input or {}, ensure_ascii=False)
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
        elif block.type == "thinking" and block.thinking is not None:
            thinking.append(block.thinking)
        elif block.type not in ("thinking", "redacted_thinking"):
            raise invalid_request(f"{q}.type {block.type!r} is not supported in assistant turns", f"{q}.type")
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "\n".join(thinking)
    return msg


def _system_text(content: str | list[Block], p: str) -> str:
    if isinstance(content, str):
        return content
    for j, block in enumerate(content):
        if block.type != "text":
            raise invalid_request(f"{p}[{j}].type {block.type!r} is not supported in system turns (text only)", p)
    return "\n".join(_text(block, f"{p}[{j}]") for j, block in enumerate(content))


def to_chat_messages(body: MessagesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(body.system, str):
        out.append({"role": "system", "content": body.system})
    elif body.system is not None:
        out.append({"role": "system", "content": "\n".join(b.text for b in body.system)})
    tool_use_ids: set[str] = set()
    for i, msg in enumerate(body.messages):
        p = f"messages[{i}].content"
        if msg.role == "system":  # a system turn in place (Claude Code's per-turn context)
            out.append({"role": "system", "content": _system_text(msg.content, p)})
        elif msg.role == "user":
            out += _user_messages(_blocks(msg.content), p, tool_use_ids)
        else:
            out.append(_assistant_message(_blocks(msg.content), p))
            tool_use_ids.update(call["id"] for call in out[-1].get("tool_calls", []))
    return out


def _tools(body: MessagesRequest) -> tuple[list[dict], str | dict]:
    """Custom tools in canonical form (deferred ones left out) and the tool choice."""
    server = [f"{t.name} ({t.type})" for t in body.tools or () if t.type not in (None, "custom")]
    if server:
        raise invalid_request(
            f"server tools are not supported, only custom tools with an input_schema: {', '.join(server)}", "tools"
        )
    tools = []
    for i, t in enumerate(body.tools or ()):
        if t.input_schema is None:
            raise invalid_request(f"tools[{i}].input_schema is required", f"tools[{i}].input_schema")
        if not t.defer_loading:
            tools.append(function_tool(t.name, t.description, t.input_schema))
    choice = body.tool_choice
    if choice is None:
        return tools, "auto"
    if choice.type == "tool":
        if not choice.name:
            raise invalid_request("tool_choice.name is required with type 'tool'", "tool_choice.name")
        return tools, tool_choice(None, choice.name, tools)
    if choice.type == "any" and not tools:
        raise invalid_request("tool_choice 'any' needs tools", "tool_choice")
    return tools, tool_choice({"auto": "auto", "any": "required", "none": "none"}[choice.type], None, tools)


def messages_request(body: MessagesRequest, cfg: ProxyConfig) -> ChatRequest:
    """The call `body` asks for. Clients send a fixed `max_tokens` (Claude Code: 32000 or more):
    it is capped at `[proxy] messages_max_tokens_cap` and, with `messages_max_tokens = "clamp"`,
    at what the context leaves (the reply then ends with stop_reason max_tokens)."""
    tools, choice = _tools(body)
    max_tokens = body.max_tokens
    if max_tokens is not None and cfg.messages_max_tokens_cap:
        max_tokens = min(max_tokens, cfg.messages_max_tokens_cap)
    fmt = body.output_config.format if body.output_config is not None else None
    fmt = fmt or body.output_format
    return ChatRequest(
        model=body.model,
        messages=normalize_messages(to_chat_messages(body)),
        stream=body.stream,
        max_tokens=max_tokens,
        clamp_max_tokens=cfg.messages_max_tokens == "clamp",
        reasoning=body.thinking is None or body.thinking.type != "disabled",
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        stop=list(body.stop_sequences or ()),
        ignore_eos=bool(body.ignore_eos),
        tools=tools,
        tool_choice=choice,
        json_schema=reply_json_schema(fmt and fmt.type, fmt and fmt.schema_, "output_config.format.schema"),
    )


# -- response --------------------------------------------------------------------------
def content_blocks(result: ChoiceResult) -> list[dict[str, Any]]:
    reply = result.reply
    blocks: list[dict[str, Any]] = [_thinking_block(reply.reasoning)] if reply.reasoning else []
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    return blocks + [_tool_use(call) for call in reply.tool_calls]


def _thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    return {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": json.loads(fn["arguments"])}


def stop_reason(state: Any, turn: Turn, result: ChoiceResult) -> tuple[str, str | None]:
    reason = result.reply.finish_reason
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if result.reply.stop_sequence is not None:
        return "stop_sequence", result.reply.stop_sequence
    return "end_turn", None


def _usage(turn: Turn, result: ChoiceResult | None) -> dict[str, Any]:
    return {
        "input_tokens": len(turn.prompt.ids),
        "output_tokens": len(result.generation.output_ids) if result else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_object(state: Any, turn: Turn, model: str, result: ChoiceResult | None) -> dict[str, Any]:
    reason, sequence = stop_reason(state, turn, result) if result else (None, None)
    return {
        "id": turn.response_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(result) if result else [],
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(turn, result),
    }


# -- route --------------------------------------------------------------------------
@model_call(router, "/v1/messages", "/sessions/{session_id}/v1/messages")
async def create_message(
    request: Request, body: MessagesRequest, caller: CallerDep, completions: Completions, state: State
) -> Response:
    """Errors leave in Anthropic's shape (the app's handlers know this route)."""
    started = time.perf_counter()
    chat = messages_request(body, state.cfg.proxy)
    header_tool_choice(chat, request.headers.get(TOOL_CHOICE_HEADER), body.tool_choice is not None)
    turn = await completions.prepare(caller, chat, "messages", "msg_")
    model = chat.model or state.served_name
    headers = {"request-id": turn.response_id, "x-areal-session-id": turn.session_id}
    if chat.stream:
        events = completions.stream(turn)
        first = await anext(events)  # an engine outage before the first token is a real error status
        return EventStream(
            _stream(state, turn, model, first, events, started),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    results = await unless_disconnected(request, completions.run(turn))
    state.observe_call("messages", started, results)
    return json_response(message_object(state, turn, model, results[0]), headers=headers)


def _event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **fields}) + b"\n\n"


class _Blocks:
    """Content blocks streamed one after another: thinking, text, each tool_use once complete."""

    _START = {"thinking": {"type": "thinking", "thinking": "", "signature": ""}, "text": {"type": "text", "text": ""}}
    _DELTA = {"thinking": "thinking_delta", "text": "text_delta"}

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def delta(self, kind: str, text: str) -> list[bytes]:
        out = []
        if self.open != kind:
            out += self.close()
            self.index += 1
            self.open = kind
            out.append(_event("content_block_start", index=self.index, content_block=self._START[kind]))
        delta = {"type": self._DELTA[kind], kind: text}
        out.append(_event("content_block_delta", index=self.index, delta=delta))
        return out

    def tool_use(self, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        partial = json.dumps(block["input"], ensure_ascii=False)
        out.append(_event("content_block_start", index=self.index, content_block={**block, "input": {}}))
        out.append(
            _event("content_block_delta", index=self.index, delta={"type": "input_json_delta", "partial_json": partial})
        )
        out.append(_event("content_block_stop", index=self.index))
        return out

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            signature = {"type": "signature_delta", "signature": ""}
            out.append(_event("content_block_delta", index=self.index, delta=signature))
        out.append(_event("content_block_stop", index=self.index))
        self.open = None
        return out


async def _stream(
    state: Any, turn: Turn, model: str, first: Any, events: AsyncIterator, started: float
) -> AsyncIterator[bytes]:
    yield _event("message_start", message=message_object(state, turn, model, None))
    blocks = _Blocks()
    item = first
    try:
        while not isinstance(item, list):
            assert isinstance(item, ChoiceDelta)
            pieces = []
            if item.reasoning:
                pieces += blocks.delta("thinking", item.reasoning)
            if item.text:
                pieces += blocks.delta("text", item.text)
            for call in item.tool_calls:
                pieces += blocks.tool_use(_tool_use(call))
            for piece in pieces:
                yield piece
            item = await anext(events)
    except APIError as exc:
        yield _event("error", error={"type": anthropic_type(exc.status), "message": exc.message})
        return
    results: list[ChoiceResult] = item
    state.observe_call("messages", started, results)
    for piece in blocks.close():
        yield piece
    reason, sequence = stop_reason(state, turn, results[0])
    usage = {"output_tokens": len(results[0].generation.output_ids)}
    yield _event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence}, usage=usage)
    yield _event("message_stop")


@model_call(router, "/v1/messages/count_tokens", "/sessions/{session_id}/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, caller: CallerDep, completions: Completions, state: State) -> Response:
    """`{"input_tokens": N}`: the length of the prompt a Messages call with this body would start
    from (as a new root: rendered, not continued). Nothing is recorded."""
    input_tokens = await completions.count_prompt_tokens(caller, messages_request(body, state.cfg.proxy))
    return json_response({"input_tokens": input_tokens})
