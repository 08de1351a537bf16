"""`POST /v1/chat/completions` (also under `/sessions/{id}/v1/`): OpenAI's wire format.

Thin: the body arrives validated (`proxy/schemas/chat.py`); prepare the turn, then either
answer once every choice is recorded, or stream `chat.completion.chunk` events as tokens are
sampled — role chunk, reasoning and content deltas, each tool call as it completes, finish chunk,
a usage chunk (always), `[DONE]` — where the finish chunks are sent only after the store commit.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from proxy.chat_request import TOOL_CHOICE_HEADER, chat_request, header_tool_choice
from proxy.completions import ChoiceDelta, ChoiceResult, Turn
from proxy.errors import APIError
from proxy.routes.common import EventStream, JsonRoute, json_response, sse, unless_disconnected
from proxy.routes.deps import CallerDep, Completions, State, model_call
from proxy.schemas.chat import ChatCompletionRequest

router = APIRouter(route_class=JsonRoute)


def token_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float], tops: Any, eos: set[int]) -> list[dict]:
    """OpenAI's logprobs.content entries for sampled tokens (the final EOS left out)."""
    entries = []
    for i, (tid, lp) in enumerate(zip(ids, logprobs)):
        if tid in eos and i == len(ids) - 1:
            break
        text = tokenizer.decode([tid])
        top = []
        if tops is not None and i < len(tops) and tops[i]:
            for alt_id, alt_lp in tops[i]:
                alt = tokenizer.decode([alt_id])
                top.append({"token": alt, "logprob": alt_lp, "bytes": list(alt.encode())})
        entries.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": top})
    return entries


def usage(turn: Turn, results: list[ChoiceResult]) -> dict[str, Any]:
    completion = sum(len(r.generation.output_ids) for r in results)
    prompt = len(turn.prompt.ids)
    cached = len(turn.prompt.ids) - len(turn.prompt.new_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def _headers(turn: Turn) -> dict[str, str]:
    return {"x-request-id": turn.response_id, "x-areal-session-id": turn.session_id}


@model_call(router, "/v1/chat/completions", "/sessions/{session_id}/v1/chat/completions")
async def chat_completions(
    request: Request, body: ChatCompletionRequest, caller: CallerDep, completions: Completions, state: State
) -> Response:
    started = time.perf_counter()
    chat = chat_request(body, state.cfg.proxy.max_n)
    header_tool_choice(chat, request.headers.get(TOOL_CHOICE_HEADER), body.tool_choice is not None)
    turn = await completions.prepare(caller, chat, "chat", "chatcmpl-")
    model = chat.model or state.served_name
    if chat.stream:
        return await _stream(state, turn, model, started)
    results = await unless_disconnected(request, completions.run(turn))
    state.observe_call("chat", started, results)
    tok = state.renderer.tokenizer
    eos = completions.eos_ids
    choices = []
    for r in results:
        message = {**r.reply.message(), "refusal": None}
        logprobs = None
        if chat.logprobs:
            g = r.generation
            logprobs = {"content": token_logprobs(tok, g.output_ids, g.logprobs, g.top_logprobs, eos), "refusal": None}
        choices.append(
            {"index": r.index, "message": message, "logprobs": logprobs, "finish_reason": r.reply.finish_reason}
        )
    payload = {
        "id": turn.response_id,
        "object": "chat.completion",
        "created": turn.created,
        "model": model,
        "choices": choices,
        "usage": usage(turn, results),
        "system_fingerprint": f"areal-v{state.engine.version}",
    }
    return json_response(payload, headers=_headers(turn))


def _call_chunks(chunk: Any, index: int, j: int, call: dict[str, Any]) -> Iterator[bytes]:
    """A finished tool call as the SDKs accumulate it: id, type and name first, then the arguments."""
    fn = call["function"]
    head = {"index": j, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}
    yield chunk(index, {"tool_calls": [head]})
    yield chunk(index, {"tool_calls": [{"index": j, "function": {"arguments": fn["arguments"]}}]})


async def _stream(state: Any, turn: Turn, model: str, started: float) -> Response:
    events = state.completions.stream(turn)
    # Wait for the first token before answering, so an engine outage is a real 503.
    first = await anext(events)
    return EventStream(
        _chunks(state, turn, model, first, events, started),
        media_type="text/event-stream",
        headers={**_headers(turn), "cache-control": "no-cache", "x-accel-buffering": "no"},
    )


async def _chunks(
    state: Any, turn: Turn, model: str, first: Any, events: AsyncIterator, started: float
) -> AsyncIterator[bytes]:
    chat = turn.request
    tok = state.renderer.tokenizer
    eos = state.completions.eos_ids
    base = {"id": turn.response_id, "object": "chat.completion.chunk", "created": turn.created, "model": model}
    fingerprint = f"areal-v{state.engine.version}"

    def chunk(index: int, delta: dict, finish: str | None = None, logprobs: Any = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return sse({**base, "system_fingerprint": fingerprint, "choices": [choice], "usage": None})

    for i in range(chat.n):
        yield chunk(i, {"role": "assistant", "content": ""})
    item = first
    try:
        while not isinstance(item, list):
            assert isinstance(item, ChoiceDelta)
            logprobs = None
            if chat.logprobs and item.token_ids:
                entries = token_logprobs(tok, item.token_ids, item.logprobs, item.top_logprobs, eos)
                logprobs = {"content": entries, "refusal": None}
            if item.reasoning:
                yield chunk(item.index, {"reasoning_content": item.reasoning})
            if item.text or logprobs:
                yield chunk(item.index, {"content": item.text}, logprobs=logprobs)
            for j, call in enumerate(item.tool_calls, start=item.first_call):
                for piece in _call_chunks(chunk, item.index, j, call):
                    yield piece
            item = await anext(events)
    except APIError as exc:
        yield sse(exc.body())
        return
    results: list[ChoiceResult] = item
    state.observe_call("chat", started, results)
    for r in results:
        yield chunk(r.index, {}, finish=r.reply.finish_reason)
    yield sse({**base, "system_fingerprint": fingerprint, "choices": [], "usage": usage(turn, results)})
    yield b"data: [DONE]\n\n"
