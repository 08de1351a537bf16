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
from starlette.responses import Response, StreamingResponse

from proxy.chat_request import ChatRequest, _integer, _number, parse_stop, parse_tool_choice, parse_tools
from proxy.completions import ChoiceDelta, ChoiceResult, Turn
from proxy.conversation import normalize_messages
from proxy.errors import APIError, invalid_request
from proxy.routes.common import caller_of, json_body, json_response, served_model, state_of

router = APIRouter()

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error(exc: APIError) -> Response:
    kind = _ERROR_TYPES.get(exc.status, "api_error")
    payload = {"type": "error", "error": {"type": kind, "message": exc.message}}
    return json_response(payload, status=exc.status, headers=exc.headers)


# -- request: blocks → chat messages ---------------------------------------------------
def _blocks(content: Any, p: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid_request(f"{p} must be a string or an array of content blocks", p)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise invalid_request(f"{p}[{j}] must be a content block with a type", f"{p}[{j}]")
    return content


def _text(block: dict[str, Any], p: str) -> str:
    if not isinstance(block.get("text"), str):
        raise invalid_request(f"{p}.text must be a string", f"{p}.text")
    return block["text"]


def _tool_result_text(block: dict[str, Any], p: str) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(_blocks(content, f"{p}.content")):
        if part["type"] != "text":
            raise invalid_request(f"{p}.content[{j}].type {part['type']!r} is not supported (text only)", p)
        texts.append(_text(part, f"{p}.content[{j}]"))
    return "\n".join(texts)


def _user_messages(blocks: list[dict[str, Any]], p: str, tool_use_ids: set[str]) -> list[dict[str, Any]]:
    """Tool results become tool messages; runs of text blocks become user messages, in order."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        q = f"{p}[{j}]"
        if block["type"] == "text":
            texts.append(_text(block, q))
        elif block["type"] == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or call_id not in tool_use_ids:
                raise invalid_request(
                    f"{q}.tool_use_id {call_id!r} does not match a tool_use block of an earlier assistant turn",
                    f"{q}.tool_use_id",
                )
            out.append({"role": "tool", "tool_call_id": call_id, "content": _tool_result_text(block, q)})
        else:
            raise invalid_request(f"{q}.type {block['type']!r} is not supported in user turns", f"{q}.type")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant_message(blocks: list[dict[str, Any]], p: str) -> dict[str, Any]:
    texts, calls, thinking = [], [], []
    for j, block in enumerate(blocks):
        q = f"{p}[{j}]"
        if block["type"] == "text":
            texts.append(_text(block, q))
        elif block["type"] == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
                raise invalid_request(f"{q} needs an id and a name", q)
            if not isinstance(arguments, dict):
                raise invalid_request(f"{q}.input must be an object", f"{q}.input")
            # The reply parser's serialization: the echoed input reproduces the recorded arguments string.
            arguments = json.dumps(arguments, ensure_ascii=False)
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif block["type"] == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif block["type"] != "redacted_thinking":
            raise invalid_request(f"{q}.type {block['type']!r} is not supported in assistant turns", f"{q}.type")
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "\n".join(thinking)
    return msg


def to_chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        if isinstance(system, str):
            out.append({"role": "system", "content": system})
        else:
            blocks = _blocks(system, "system")
            out.append({"role": "system", "content": "\n".join(_text(b, f"system[{i}]") for i, b in enumerate(blocks))})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise invalid_request("messages must be a non-empty array", "messages")
    tool_use_ids: set[str] = set()
    for i, msg in enumerate(raw):
        p = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise invalid_request(f"{p}.role must be 'user' or 'assistant'", f"{p}.role")
        blocks = _blocks(msg.get("content"), f"{p}.content")
        if msg["role"] == "user":
            out += _user_messages(blocks, f"{p}.content", tool_use_ids)
        else:
            out.append(_assistant_message(blocks, f"{p}.content"))
            tool_use_ids.update(call["id"] for call in out[-1].get("tool_calls", []))
    return out


def _tools(body: dict[str, Any]) -> tuple[list[dict], str | dict]:
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise invalid_request("tools must be an array", "tools")
    chat_tools = []
    for i, tool in enumerate(raw or []):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            raise invalid_request(f"tools[{i}] must be a custom tool with a name and an input_schema", f"tools[{i}]")
        fn = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        chat_tools.append({"type": "function", "function": fn})
    tools = parse_tools(chat_tools)
    choice = body.get("tool_choice")
    if choice is None:
        return tools, "auto"
    kind = choice.get("type") if isinstance(choice, dict) else None
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if kind == "tool":
        mapped = {"type": "function", "function": {"name": choice.get("name")}}
    if mapped is None:
        raise invalid_request("tool_choice.type must be auto, any, tool or none", "tool_choice")
    return tools, parse_tool_choice(mapped, tools)


def parse_messages_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise invalid_request("model must be a string", "model")
    max_tokens = _integer(body, "max_tokens", 1)
    if max_tokens is None:
        raise invalid_request("max_tokens: Field required", "max_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid_request("stream must be a boolean", "stream")
    tools, tool_choice = _tools(body)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if top_p <= 0.0:
        raise invalid_request("top_p must be greater than 0", "top_p")
    return ChatRequest(
        model=model,
        messages=normalize_messages(to_chat_messages(body)),
        stream=stream,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 1.0, 1.0),
        top_p=top_p,
        top_k=max(0, _integer(body, "top_k", 0) or 0),
        stop=parse_stop(body.get("stop_sequences") or None),
        tools=tools,
        tool_choice=tool_choice,
    )


# -- response --------------------------------------------------------------------------
def content_blocks(result: ChoiceResult) -> list[dict[str, Any]]:
    reply = result.reply
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.content}] if reply.content else []
    for call in reply.tool_calls:
        fn = call["function"]
        blocks.append({"type": "tool_use", "id": call["id"], "name": fn["name"], "input": json.loads(fn["arguments"])})
    return blocks


def stop_reason(state: Any, turn: Turn, result: ChoiceResult) -> tuple[str, str | None]:
    reason = result.reply.finish_reason
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if turn.request.stop:
        text = turn.request.forced_prefix() + state.renderer.tokenizer.decode(
            result.generation.output_ids, skip_special_tokens=True
        )
        tail = text[len(result.reply.content or "") :]
        for s in turn.request.stop:
            if tail.startswith(s):
                return "stop_sequence", s
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
@router.post("/v1/messages")
@router.post("/sessions/{session_id}/v1/messages")
async def create_message(request: Request, session_id: str | None = None) -> Response:
    try:
        return await _create(request, session_id)
    except APIError as exc:
        return anthropic_error(exc)


async def _create(request: Request, session_id: str | None) -> Response:
    state = state_of(request)
    state.require_ready()
    started = time.perf_counter()
    chat = parse_messages_request(await json_body(request))
    turn = await state.completions.prepare(caller_of(request, session_id), chat, "messages", "msg_")
    model = chat.model or served_model(state)
    headers = {"request-id": turn.response_id, "x-areal-session-id": turn.session_id}
    if chat.stream:
        events = state.completions.stream(turn)
        first = await anext(events)  # an engine outage before the first token is a real error status
        return StreamingResponse(
            _stream(state, turn, model, first, events, started),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    results = await state.completions.run(turn)
    state.observe_call("messages", started, results)
    return json_response(message_object(state, turn, model, results[0]), headers=headers)


def _event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **fields}) + b"\n\n"


async def _stream(
    state: Any, turn: Turn, model: str, first: Any, events: AsyncIterator, started: float
) -> AsyncIterator[bytes]:
    yield _event("message_start", message=message_object(state, turn, model, None))
    text_open = False
    item = first
    try:
        while not isinstance(item, list):
            assert isinstance(item, ChoiceDelta)
            if item.text:
                if not text_open:
                    text_open = True
                    yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                yield _event("content_block_delta", index=0, delta={"type": "text_delta", "text": item.text})
            item = await anext(events)
    except APIError as exc:
        kind = _ERROR_TYPES.get(exc.status, "api_error")
        yield _event("error", error={"type": kind, "message": exc.message})
        return
    results: list[ChoiceResult] = item
    state.observe_call("messages", started, results)
    index = 0
    if text_open:
        yield _event("content_block_stop", index=0)
        index = 1
    for block in content_blocks(results[0]):
        if block["type"] != "tool_use":
            continue
        yield _event("content_block_start", index=index, content_block={**block, "input": {}})
        partial = json.dumps(block["input"], ensure_ascii=False)
        yield _event("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial})
        yield _event("content_block_stop", index=index)
        index += 1
    reason, sequence = stop_reason(state, turn, results[0])
    usage = {"output_tokens": len(results[0].generation.output_ids)}
    yield _event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence}, usage=usage)
    yield _event("message_stop")
