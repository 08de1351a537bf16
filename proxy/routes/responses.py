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
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

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
from proxy.conversation import content_text, normalize_messages
from proxy.errors import APIError, invalid_request, not_found
from proxy.routes.chat import token_logprobs, usage
from proxy.routes.common import EventStream, JsonRoute, json_response, unless_disconnected
from proxy.routes.deps import CallerDep, Completions, State, model_call
from proxy.schemas.responses import InputItem, NamedFunctionChoice, ResponsesRequest
from proxy.sessions import Caller
from proxy.store.turns import response_messages

if TYPE_CHECKING:
    from proxy.state import AppState

router = APIRouter(route_class=JsonRoute)

_LOGPROBS_INCLUDE = "message.output_text.logprobs"


# -- request: items → chat messages ---------------------------------------------------
def _texts(parts: Any, param: str) -> str:
    """A message's or a function output's content (a string, or text parts) as one string."""
    if isinstance(parts, list):
        parts = [p if isinstance(p, str) else p.model_dump(exclude_none=True) for p in parts]
    return content_text(parts, param)


def input_messages(items: str | list[InputItem], call_ids: set[str]) -> list[dict[str, Any]]:
    """Responses input (a string or items) as chat messages, assistant output items merged per turn.

    `call_ids` holds the call ids of earlier turns (previous_response_id); new ones are added.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    turn_open = False  # the last message is an assistant turn that function_call items may join
    reasoning: list[str] = []
    for i, item in enumerate(items):
        p = f"input[{i}]"
        kind = item.type or ("message" if item.role is not None else None)
        if kind == "message":
            if item.role is None:
                raise invalid_request(f"{p}.role is required for a message item", f"{p}.role")
            msg: dict[str, Any] = {"role": item.role, "content": _texts(item.content, f"{p}.content")}
            if item.role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = "\n".join(reasoning), []
            messages.append(msg)
            turn_open = item.role == "assistant"
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
            if item.call_id not in call_ids:
                raise invalid_request(f"{p}.call_id {item.call_id!r} matches no earlier function_call", f"{p}.call_id")
            text = _texts(item.output if item.output is not None else "", f"{p}.output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
            turn_open = False
        elif kind == "reasoning":
            reasoning.extend(_reasoning_texts(item))
            turn_open = False  # reasoning opens the next assistant turn
        else:
            raise invalid_request(
                f"{p} needs a type (message, function_call, function_call_output, reasoning)", f"{p}.type"
            )
    return messages


def _function_call(item: InputItem, p: str) -> dict[str, Any]:
    if item.call_id is None:
        raise invalid_request(f"{p}.call_id is required", f"{p}.call_id")
    if not item.name:
        raise invalid_request(f"{p}.name is required", f"{p}.name")
    arguments = item.arguments if item.arguments is not None else ""
    return {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": arguments}}


def _reasoning_texts(item: InputItem) -> list[str]:
    """A reasoning item's full text when given, else its summary."""
    full = item.content if isinstance(item.content, list) else []
    for parts in (full, item.summary or []):
        texts = [part.text for part in parts if not isinstance(part, str) and part.text is not None]
        if texts:
            return texts
    return []


def chat_tools_and_choice(body: ResponsesRequest) -> tuple[list[dict], str | dict]:
    """Flat Responses function tools → chat tools, and the tool choice."""
    tools = [function_tool(t.name, t.description, t.parameters) for t in body.tools or ()]
    choice = body.tool_choice
    if isinstance(choice, NamedFunctionChoice):
        return tools, tool_choice(None, choice.name, tools)
    return tools, tool_choice(choice, None, tools)


def echoed_tools(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's tools as a Response object echoes them."""
    out = []
    for t in body.tools or ():
        fn = function_tool(t.name, t.description, t.parameters)["function"]
        out.append({"type": "function", "strict": t.strict, "parameters": None, **fn})
    return out


def responses_request(body: ResponsesRequest, history: list[dict[str, Any]] | None) -> ChatRequest:
    if body.conversation is not None:
        raise invalid_request("conversation is not supported: resend the items or use previous_response_id")
    if body.input is None and history is None:
        raise invalid_request("input is required", "input")
    messages = list(history or [])
    if body.instructions is not None:
        system = {"role": "system", "content": body.instructions}
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": body.instructions}
        else:
            messages.insert(0, system)
    if body.input is not None:
        known = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
        messages += input_messages(body.input, known)
    if not messages:
        raise invalid_request("input must contain at least one item", "input")
    tools, choice = chat_tools_and_choice(body)
    fmt = body.text.format if body.text is not None else None
    return ChatRequest(
        model=body.model,
        messages=normalize_messages(messages),
        stream=body.stream,
        max_tokens=body.max_output_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        ignore_eos=bool(body.ignore_eos),
        logprobs=_LOGPROBS_INCLUDE in (body.include or ()),
        top_logprobs=body.top_logprobs or 0,
        tools=tools,
        tool_choice=choice,
        json_schema=reply_json_schema(fmt and fmt.type, fmt and fmt.schema_, "text.format.schema"),
    )


async def previous_messages(state: AppState, caller: Caller, response_id: str) -> list[dict[str, Any]]:
    """The full conversation of a recorded response, its reply included, if the caller may see it."""
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


def _reasoning_id(turn: Turn) -> str:
    return "rs_" + turn.response_id.removeprefix("resp_")


def _reasoning_item(turn: Turn, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"id": _reasoning_id(turn), "type": "reasoning", "status": status, "summary": [], "content": content}


def output_items(turn: Turn, result: ChoiceResult, logprobs: list[dict]) -> list[dict[str, Any]]:
    """A reasoning item (when the model reasoned), a message item (unless the reply is tool calls
    alone), then one function_call item per call."""
    reply = result.reply
    items = [_reasoning_item(turn, reply.reasoning)] if reply.reasoning else []
    if reply.content or not reply.tool_calls:
        items.append(_message_item(turn, reply.content or "", logprobs))
    items += [_call_item(call) for call in reply.tool_calls]
    return items


def _text_format(body: ResponsesRequest) -> dict[str, Any]:
    """The request's `text.format`, echoed as OpenAI does (plain text when none was given)."""
    fmt = body.text.format if body.text is not None else None
    return fmt.model_dump(by_alias=True, exclude_none=True) if fmt is not None else {"type": "text"}


def response_object(
    turn: Turn, body: ResponsesRequest, model: str, output: list[dict], results: list[ChoiceResult] | None
) -> dict[str, Any]:
    request = turn.request
    done = results is not None
    truncated = done and results[0].reply.finish_reason == "length"
    choice = request.tool_choice
    tools = echoed_tools(body)
    payload: dict[str, Any] = {
        "id": turn.response_id,
        "object": "response",
        "created_at": turn.created,
        # A length cut is reported in incomplete_details, not as status "incomplete", on which agent SDKs raise.
        "status": "completed" if done else "in_progress",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "instructions": body.instructions,
        "max_output_tokens": request.max_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": request.temperature,
        "text": {"format": _text_format(body)},
        "tool_choice": {"type": "function", "name": choice["function"]["name"]} if isinstance(choice, dict) else choice,
        "tools": tools,
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": None,
        "metadata": body.metadata or {},
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
@model_call(router, "/v1/responses", "/sessions/{session_id}/v1/responses")
async def create_response(
    request: Request, body: ResponsesRequest, caller: CallerDep, completions: Completions, state: State
) -> Response:
    started = time.perf_counter()
    history = None
    if body.previous_response_id is not None:
        history = await previous_messages(state, caller, body.previous_response_id)
    chat = responses_request(body, history)
    header_tool_choice(chat, request.headers.get(TOOL_CHOICE_HEADER), body.tool_choice is not None)
    turn = await completions.prepare(caller, chat, "responses", "resp_")
    model = chat.model or state.served_name
    headers = {"x-request-id": turn.response_id, "x-areal-session-id": turn.session_id}
    if chat.stream:
        events = completions.stream(turn)
        first = await anext(events)  # an engine outage before the first token is a real 503
        return EventStream(
            _stream(state, turn, body, model, first, events, started),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    results = await unless_disconnected(request, completions.run(turn))
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


class _Output:
    """Output items streamed as the reply grows: reasoning first, the message's text as it comes
    (the message stays open until the end), each function call the moment it is complete."""

    def __init__(self, turn: Turn, event: _Events) -> None:
        self.turn, self.event = turn, event
        self.items: list[dict[str, Any]] = []
        self.reasoning: dict[str, Any] | None = None  # the open reasoning item and its text so far
        self.message_at: int | None = None

    def reasoning_delta(self, text: str) -> Iterator[bytes]:
        if self.reasoning is None:
            self.reasoning = {"index": len(self.items), "text": ""}
            self.items.append(_reasoning_item(self.turn, "", "in_progress"))
            yield self.event("response.output_item.added", output_index=self.reasoning["index"], item=self.items[-1])
        self.reasoning["text"] += text
        at = {"item_id": _reasoning_id(self.turn), "output_index": self.reasoning["index"], "content_index": 0}
        yield self.event("response.reasoning_text.delta", **at, delta=text)

    def close_reasoning(self) -> Iterator[bytes]:
        if self.reasoning is None or self.items[self.reasoning["index"]]["status"] == "completed":
            return
        index, text = self.reasoning["index"], self.reasoning["text"]
        at = {"item_id": _reasoning_id(self.turn), "output_index": index, "content_index": 0}
        yield self.event("response.reasoning_text.done", **at, text=text)
        self.items[index] = _reasoning_item(self.turn, text)
        yield self.event("response.output_item.done", output_index=index, item=self.items[index])

    def text_delta(self, text: str) -> Iterator[bytes]:
        yield from self.close_reasoning()
        yield from self.open_message()
        yield self.event("response.output_text.delta", **self._where(), delta=text, logprobs=[])

    def open_message(self) -> Iterator[bytes]:
        if self.message_at is not None:
            return
        self.message_at = len(self.items)
        self.items.append(_message_item(self.turn, "", [], "in_progress"))
        yield self.event("response.output_item.added", output_index=self.message_at, item=self.items[-1])
        yield self.event("response.content_part.added", **self._where(), part=_text_part("", []))

    def call(self, call: dict[str, Any]) -> Iterator[bytes]:
        yield from self.close_reasoning()
        index = len(self.items)
        done = _call_item(call)
        at = {"item_id": done["id"], "output_index": index}
        yield self.event("response.output_item.added", output_index=index, item=_call_item(call, "in_progress", ""))
        yield self.event("response.function_call_arguments.delta", **at, delta=done["arguments"])
        yield self.event("response.function_call_arguments.done", **at, arguments=done["arguments"])
        self.items.append(done)
        yield self.event("response.output_item.done", output_index=index, item=done)

    def finish(self, result: ChoiceResult, logprobs: list[dict]) -> Iterator[bytes]:
        yield from self.close_reasoning()
        reply = result.reply
        if reply.content or not reply.tool_calls:
            yield from self.open_message()
        if self.message_at is not None:
            item = _message_item(self.turn, reply.content or "", logprobs)
            part = item["content"][0]
            yield self.event("response.output_text.done", **self._where(), text=part["text"], logprobs=logprobs)
            yield self.event("response.content_part.done", **self._where(), part=part)
            self.items[self.message_at] = item
            yield self.event("response.output_item.done", output_index=self.message_at, item=item)

    def _where(self) -> dict[str, Any]:
        return {"item_id": _message_id(self.turn), "output_index": self.message_at, "content_index": 0}


async def _stream(
    state: AppState, turn: Turn, body: ResponsesRequest, model: str, first: Any, events: AsyncIterator, started: float
) -> AsyncIterator[bytes]:
    event = _Events()
    yield event("response.created", response=response_object(turn, body, model, [], None))
    yield event("response.in_progress", response=response_object(turn, body, model, [], None))
    output = _Output(turn, event)
    item = first
    try:
        while not isinstance(item, list):
            assert isinstance(item, ChoiceDelta)
            pieces = list(output.reasoning_delta(item.reasoning)) if item.reasoning else []
            if item.text:
                pieces += output.text_delta(item.text)
            for call in item.tool_calls:
                pieces += output.call(call)
            for piece in pieces:
                yield piece
            item = await anext(events)
    except APIError as exc:
        yield event("error", code=exc.code, message=exc.message, param=exc.param)
        return
    results: list[ChoiceResult] = item
    state.observe_call("responses", started, results)
    for piece in output.finish(results[0], _logprobs(state, turn, results[0])):
        yield piece
    yield event("response.completed", response=response_object(turn, body, model, output.items, results))
