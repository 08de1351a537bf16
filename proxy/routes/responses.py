"""`POST /v1/responses` (also under `/sessions/{id}/v1/`): the Responses API as the Agents SDK speaks it.

Input items become canonical chat messages for `CompletionService`, so the
conversation tree and token-exact continuation are shared with Chat Completions.
The SDK resends the whole history as items, echoing call ids and argument strings
verbatim; an assistant turn the proxy produced (one `message` item, then its
`function_call` items) is merged back into one assistant message with its content
and tool calls in order, which is exactly the message recorded, so it hashes to
its node. `previous_response_id` replays a recorded conversation from the store.
Streams emit the usual `response.*` events; `response.completed` only after commit.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from proxy.chat_request import ChatRequest, _bool, _integer, _number, parse_tool_choice, parse_tools
from proxy.completions import ChoiceDelta, ChoiceResult, Turn
from proxy.conversation import content_text, normalize_messages
from proxy.errors import APIError, invalid_request, not_found
from proxy.routes.chat import token_logprobs, usage
from proxy.routes.common import caller_of, json_body, json_response, served_model, state_of
from proxy.sessions import Caller
from proxy.store.turns import response_messages

router = APIRouter()

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_LOGPROBS_INCLUDE = "message.output_text.logprobs"


# -- request: items → chat messages ---------------------------------------------------
def input_messages(raw: Any, call_ids: set[str]) -> list[dict[str, Any]]:
    """Responses input (a string or items) as chat messages, assistant output items merged per turn.

    `call_ids` holds the call ids of earlier turns (previous_response_id); new ones are added.
    """
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise invalid_request("input must be a string or an array of input items", "input")
    messages: list[dict[str, Any]] = []
    turn_open = False  # the last message is an assistant turn that function_call items may join
    reasoning: list[str] = []
    for i, item in enumerate(raw):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid_request(f"{p} must be an object", p)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise invalid_request(f"{p}.role must be one of {', '.join(_MESSAGE_ROLES)}", f"{p}.role")
            msg: dict[str, Any] = {"role": role, "content": content_text(item.get("content"), f"{p}.content")}
            if role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = "\n".join(reasoning), []
            messages.append(msg)
            turn_open = role == "assistant"
        elif kind == "function_call":
            call = _function_call(item, p)
            call_ids.add(call["id"])
            if turn_open:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"], reasoning = "\n".join(reasoning), []
                messages.append(msg)
                turn_open = True
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or call_id not in call_ids:
                raise invalid_request(f"{p}.call_id {call_id!r} matches no earlier function_call", f"{p}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output, f"{p}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            turn_open = False
        elif kind == "reasoning":
            reasoning.extend(_reasoning_texts(item, p))
            turn_open = False  # reasoning opens the next assistant turn
        else:
            raise invalid_request(
                f"{p}.type {kind!r} is not supported: use message, function_call, function_call_output or reasoning",
                f"{p}.type",
            )
    return messages


def _function_call(item: dict[str, Any], p: str) -> dict[str, Any]:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
    if not isinstance(call_id, str) or not call_id:
        raise invalid_request(f"{p}.call_id is required", f"{p}.call_id")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"{p}.name is required", f"{p}.name")
    if not isinstance(arguments, str):
        raise invalid_request(f"{p}.arguments must be a JSON string", f"{p}.arguments")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _reasoning_texts(item: dict[str, Any], p: str) -> list[str]:
    texts = []
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise invalid_request(f"{p}.{key} must be an array", f"{p}.{key}")
        texts += [part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str)]
        if texts:
            break  # full reasoning text when given, else its summary
    return texts


def parse_tools_and_choice(body: dict[str, Any]) -> tuple[list[dict], str | dict, list[dict]]:
    """Flat Responses function tools → chat tools; also the tools as echoed back."""
    raw = body.get("tools")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise invalid_request("tools must be an array", "tools")
    chat_tools, echo = [], []
    for i, tool in enumerate(raw):
        p = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise invalid_request(f"{p}.type {kind!r} is not supported: only function tools are", f"{p}.type")
        if not isinstance(tool.get("name"), str):
            raise invalid_request(f"{p}.name is required", f"{p}.name")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        chat_tools.append({"type": "function", "function": fn})
        echo.append({"type": "function", "strict": tool.get("strict"), "parameters": None, **fn})
    tools = parse_tools(chat_tools)
    raw_choice = body.get("tool_choice")
    if isinstance(raw_choice, dict):
        if raw_choice.get("type") != "function" or not isinstance(raw_choice.get("name"), str):
            raise invalid_request("tool_choice must be auto, none, required or {type: function, name}", "tool_choice")
        raw_choice = {"type": "function", "function": {"name": raw_choice["name"]}}
    return tools, parse_tool_choice(raw_choice, tools), echo


def parse_responses_request(body: Any, history: list[dict[str, Any]] | None) -> ChatRequest:
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise invalid_request("model must be a string", "model", "invalid_type")
    if body.get("conversation") is not None:
        raise invalid_request("conversation is not supported: resend the items or use previous_response_id")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid_request("instructions must be a string", "instructions")
    if body.get("input") is None and history is None:
        raise invalid_request("input is required", "input")
    messages = list(history or [])
    if instructions is not None:
        system = {"role": "system", "content": instructions}
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": instructions}
        else:
            messages.insert(0, system)
    if body.get("input") is not None:
        known = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
        messages += input_messages(body["input"], known)
    if not messages:
        raise invalid_request("input must contain at least one item", "input")
    tools, tool_choice, _ = parse_tools_and_choice(body)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if top_p <= 0.0:
        raise invalid_request("top_p must be greater than 0", "top_p", "invalid_value")
    include = body.get("include") or []
    top_logprobs = _integer(body, "top_logprobs", 0, 20) or 0
    return ChatRequest(
        model=model,
        messages=normalize_messages(messages),
        stream=_bool(body, "stream"),
        max_tokens=_integer(body, "max_output_tokens", 1),
        temperature=_number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=top_p,
        logprobs=isinstance(include, list) and _LOGPROBS_INCLUDE in include,
        top_logprobs=top_logprobs,
        tools=tools,
        tool_choice=tool_choice,
    )


async def previous_messages(state: Any, caller: Caller, response_id: Any) -> list[dict[str, Any]]:
    """The full conversation of a recorded response, its reply included, if the caller may see it."""
    if not isinstance(response_id, str) or not response_id:
        raise invalid_request("previous_response_id must be a string", "previous_response_id")
    session = await state.sessions.for_model_call(caller)

    session_id = session.id if session is not None else None
    messages = await state.db.aread(lambda c: response_messages(c, response_id, session_id))
    if messages is None:
        raise not_found(f"no response {response_id!r} in this session", "previous_response_id")
    return messages


# -- response: reply → output items ----------------------------------------------------
def _message_id(turn: Turn) -> str:
    return "msg_" + turn.response_id.removeprefix("resp_")


def _call_item(call: dict[str, Any], status: str = "completed", arguments: str | None = None) -> dict[str, Any]:
    fn = call["function"]
    return {
        "id": "fc_" + call["id"].removeprefix("call_"),
        "type": "function_call",
        "status": status,
        "call_id": call["id"],
        "name": fn["name"],
        "arguments": fn["arguments"] if arguments is None else arguments,
    }


def _text_part(text: str, logprobs: list[dict]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _message_item(turn: Turn, text: str, logprobs: list[dict], status: str = "completed") -> dict[str, Any]:
    content = [_text_part(text, logprobs)] if status == "completed" else []
    return {"id": _message_id(turn), "type": "message", "role": "assistant", "status": status, "content": content}


def output_items(turn: Turn, result: ChoiceResult, logprobs: list[dict]) -> list[dict[str, Any]]:
    """A message item (unless the reply is tool calls alone), then one function_call item per call."""
    reply = result.reply
    items = []
    if reply.content or not reply.tool_calls:
        items.append(_message_item(turn, reply.content or "", logprobs))
    items += [_call_item(call) for call in reply.tool_calls]
    return items


def response_object(
    turn: Turn, body: dict[str, Any], model: str, output: list[dict], results: list[ChoiceResult] | None
) -> dict[str, Any]:
    request = turn.request
    done = results is not None
    truncated = done and results[0].reply.finish_reason == "length"
    choice = request.tool_choice
    _, _, tools = parse_tools_and_choice(body)
    payload: dict[str, Any] = {
        "id": turn.response_id,
        "object": "response",
        "created_at": turn.created,
        # A length cut is reported in incomplete_details, not as status "incomplete", on which agent SDKs raise.
        "status": "completed" if done else "in_progress",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": request.max_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": request.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": {"type": "function", "name": choice["function"]["name"]} if isinstance(choice, dict) else choice,
        "tools": tools,
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": None,
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
    }
    if done:
        chat = usage(turn, results)
        payload["completed_at"] = int(time.time())
        payload["usage"] = {
            "input_tokens": chat["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": chat["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": chat["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat["total_tokens"],
        }
    return payload


def _logprobs(state: Any, turn: Turn, result: ChoiceResult) -> list[dict]:
    if not turn.request.logprobs:
        return []
    g = result.generation
    tok, eos = state.renderer.tokenizer, state.completions.eos_ids
    return token_logprobs(tok, g.output_ids, g.logprobs, g.top_logprobs, eos)


# -- route --------------------------------------------------------------------------
@router.post("/v1/responses")
@router.post("/sessions/{session_id}/v1/responses")
async def create_response(request: Request, session_id: str | None = None) -> Response:
    state = state_of(request)
    state.require_ready()
    started = time.perf_counter()
    body = await json_body(request)
    caller = caller_of(request, session_id)
    history = None
    if isinstance(body, dict) and body.get("previous_response_id") is not None:
        history = await previous_messages(state, caller, body["previous_response_id"])
    chat = parse_responses_request(body, history)
    turn = await state.completions.prepare(caller, chat, "responses", "resp_")
    model = chat.model or served_model(state)
    headers = {"x-request-id": turn.response_id, "x-areal-session-id": turn.session_id}
    if chat.stream:
        events = state.completions.stream(turn)
        first = await anext(events)  # an engine outage before the first token is a real 503
        return StreamingResponse(
            _stream(state, turn, body, model, first, events, started),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    results = await state.completions.run(turn)
    state.observe_call("responses", started, results)
    output = output_items(turn, results[0], _logprobs(state, turn, results[0]))
    return json_response(response_object(turn, body, model, output, results), headers=headers)


class _Events:
    """Server-sent `response.*` events, numbered in order."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: ".encode() + orjson.dumps(payload) + b"\n\n"


def _open_message(event: _Events, turn: Turn) -> list[bytes]:
    return [
        event("response.output_item.added", output_index=0, item=_message_item(turn, "", [], "in_progress")),
        event(
            "response.content_part.added",
            item_id=_message_id(turn),
            output_index=0,
            content_index=0,
            part=_text_part("", []),
        ),
    ]


async def _stream(
    state: Any, turn: Turn, body: dict, model: str, first: Any, events: AsyncIterator, started: float
) -> AsyncIterator[bytes]:
    event = _Events()
    yield event("response.created", response=response_object(turn, body, model, [], None))
    yield event("response.in_progress", response=response_object(turn, body, model, [], None))
    where = {"item_id": _message_id(turn), "output_index": 0, "content_index": 0}
    text_started = False
    item = first
    try:
        while not isinstance(item, list):
            assert isinstance(item, ChoiceDelta)
            if item.text:
                if not text_started:
                    text_started = True
                    for opening in _open_message(event, turn):
                        yield opening
                yield event("response.output_text.delta", **where, delta=item.text, logprobs=[])
            item = await anext(events)
    except APIError as exc:
        yield event("error", code=exc.code, message=exc.message, param=exc.param)
        return
    results: list[ChoiceResult] = item
    state.observe_call("responses", started, results)
    output = output_items(turn, results[0], _logprobs(state, turn, results[0]))
    for index, out in enumerate(output):
        if out["type"] == "message":
            part = out["content"][0]
            if not text_started:
                for opening in _open_message(event, turn):
                    yield opening
            yield event("response.output_text.done", **where, text=part["text"], logprobs=part["logprobs"])
            yield event("response.content_part.done", **where, part=part)
        else:
            call = {"id": out["call_id"], "function": {"name": out["name"], "arguments": out["arguments"]}}
            at = {"item_id": out["id"], "output_index": index}
            yield event("response.output_item.added", output_index=index, item=_call_item(call, "in_progress", ""))
            yield event("response.function_call_arguments.delta", **at, delta=out["arguments"])
            yield event("response.function_call_arguments.done", **at, arguments=out["arguments"])
        yield event("response.output_item.done", output_index=index, item=out)
    yield event("response.completed", response=response_object(turn, body, model, output, results))
