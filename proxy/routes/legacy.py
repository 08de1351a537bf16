"""`POST /v1/completions` (also under `/sessions/{id}/v1/`): OpenAI's legacy Completions API.

The prompt is text, tokenized as is (no chat template), or token ids used as given. The call is
recorded like every other (api "completions"): a root of its session's tree whose request holds
no messages and the prompt as given under `prompt`, so it is training data with its exact ids.
The text answered is what the model sampled with stop strings trimmed: no reasoning or tool-call
parsing. `logprobs: k` gives every sampled token's `{tokens, token_logprobs, top_logprobs,
text_offset}` (the sampled token plus k alternatives); `echo` prepends the prompt's text;
`return_token_ids` (vLLM's) adds the top-level `prompt_token_ids` and each choice's `token_ids`,
in a stream the first chunk carrying the prompt's and each chunk its own. One prompt a request:
a batch of several is refused with a 400.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from proxy.chat_request import ChatRequest
from proxy.completions import ChoiceDelta, ChoiceResult, Turn
from proxy.errors import APIError, invalid_request
from proxy.reply import ReplyBuilder
from proxy.routes.common import EventStream, JsonRoute, json_response, sse, unless_disconnected
from proxy.routes.deps import CallerDep, Completions, State, model_call
from proxy.schemas.completions import CompletionRequest

router = APIRouter(route_class=JsonRoute)

_IGNORED = ("presence_penalty", "frequency_penalty", "logit_bias")


@dataclasses.dataclass
class Legacy:
    """What the answer needs beyond the shared `ChatRequest`."""

    logprobs: int | None
    echo: bool
    return_token_ids: bool


def one_prompt(prompt: Any) -> str | list[int]:
    """The request's single prompt: text or token ids, unwrapped from a one-element list."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) > 1:
            raise invalid_request(
                f"prompt holds a batch of {len(prompt)} prompts; send one prompt a request", "prompt", "invalid_value"
            )
        prompt = prompt[0]
    if not prompt:
        raise invalid_request("the prompt is empty", "prompt", "invalid_value")
    return prompt


def legacy_request(body: CompletionRequest, max_n: int) -> tuple[ChatRequest, str | list[int], Legacy]:
    n = body.n or 1
    if n > max_n:
        raise invalid_request(f"n must be at most {max_n} on this server, got {n}", "n", "invalid_value")
    if body.best_of is not None and body.best_of != n:
        raise invalid_request(f"best_of must equal n ({n}): choices are not ranked here", "best_of", "invalid_value")
    if body.suffix:
        raise invalid_request("suffix (insertion) is not supported", "suffix", "invalid_value")
    if body.echo and body.logprobs is not None:
        raise invalid_request("echo with logprobs needs the prompt's logprobs, which are not computed", "echo")
    stop = body.stop
    chat = ChatRequest(
        model=body.model,
        messages=[],
        stream=body.stream,
        n=n,
        max_tokens=body.max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(0, body.top_k or 0),
        seed=body.seed,
        stop=[stop] if isinstance(stop, str) else list(stop or ()),
        ignore_eos=bool(body.ignore_eos),
        # Every delta then carries its token ids, which this route decodes itself (see `_builder`).
        logprobs=True,
        top_logprobs=body.logprobs or 0,
        ignored=[k for k in _IGNORED if getattr(body, k) is not None],
    )
    legacy = Legacy(body.logprobs, bool(body.echo), bool(body.return_token_ids))
    return chat, one_prompt(body.prompt), legacy


def _builder(state: Any, turn: Turn) -> ReplyBuilder:
    """The text of sampled ids, stop strings trimmed, without the family's reasoning split: the
    completion of a raw prompt is plain text, `<think>` and all."""
    parsers = dataclasses.replace(state.renderer.parsers, reasoning=None)
    return ReplyBuilder(state.renderer.tokenizer, turn.request.stop, None, "", parsers)


def token_logprobs(tok: Any, ids: list[int], lps: list[float], tops: Any, offset: int) -> tuple[dict[str, list], int]:
    """The legacy `logprobs` object of sampled tokens whose text starts at `offset`, and where their
    text ends. A special token (the final EOS) is named in `tokens` and adds no text."""
    tokens, offsets, alternatives = [], [], []
    for i, (tid, lp) in enumerate(zip(ids, lps)):
        text = tok.decode([tid])
        top = {text: lp}
        for alt_id, alt_lp in tops[i] if tops is not None and i < len(tops) and tops[i] else ():
            top.setdefault(tok.decode([alt_id]), alt_lp)
        tokens.append(text)
        offsets.append(offset)
        alternatives.append(top)
        offset += len(tok.decode([tid], skip_special_tokens=True))
    entries = {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": alternatives, "text_offset": offsets}
    return entries, offset


def usage(turn: Turn, results: list[ChoiceResult]) -> dict[str, int]:
    completion = sum(len(r.generation.output_ids) for r in results)
    prompt = len(turn.prompt.ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def echo_text(state: Any, turn: Turn) -> str:
    raw = turn.raw_prompt
    return raw if isinstance(raw, str) else state.renderer.tokenizer.decode(turn.prompt.ids)


def _headers(turn: Turn) -> dict[str, str]:
    return {"x-request-id": turn.response_id, "x-areal-session-id": turn.session_id}


@model_call(router, "/v1/completions", "/sessions/{session_id}/v1/completions")
async def completions_route(
    request: Request, body: CompletionRequest, caller: CallerDep, completions: Completions, state: State
) -> Response:
    started = time.perf_counter()
    chat, prompt, legacy = legacy_request(body, state.cfg.proxy.max_n)
    add_special = True if body.add_special_tokens is None else body.add_special_tokens
    turn = await completions.prepare_raw(caller, chat, prompt, add_special, "cmpl-")
    model = chat.model or state.served_name
    if chat.stream:
        events = completions.stream(turn)
        first = await anext(events)  # an engine outage before the first token is a real error status
        return EventStream(
            _chunks(state, turn, legacy, model, first, events, started),
            media_type="text/event-stream",
            headers={**_headers(turn), "cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    results = await unless_disconnected(request, completions.run(turn))
    state.observe_call("completions", started, results)
    return json_response(_answer(state, turn, legacy, model, results), headers=_headers(turn))


def _answer(state: Any, turn: Turn, legacy: Legacy, model: str, results: list[ChoiceResult]) -> dict[str, Any]:
    tok = state.renderer.tokenizer
    prefix = echo_text(state, turn) if legacy.echo else ""
    choices = []
    for r in results:
        g = r.generation
        builder = _builder(state, turn)
        builder.feed(g.output_ids)
        reply = builder.finish(g.finish_reason)[1]
        choice: dict[str, Any] = {
            "index": r.index,
            "text": prefix + (reply.content or ""),
            "logprobs": None,
            "finish_reason": reply.finish_reason,
        }
        if legacy.logprobs is not None:
            choice["logprobs"] = token_logprobs(tok, g.output_ids, g.logprobs, g.top_logprobs, len(prefix))[0]
        if legacy.return_token_ids:
            choice["token_ids"] = g.output_ids
        choices.append(choice)
    payload: dict[str, Any] = {
        "id": turn.response_id,
        "object": "text_completion",
        "created": turn.created,
        "model": model,
        "choices": choices,
        "usage": usage(turn, results),
        "system_fingerprint": f"areal-v{state.engine.version}",
    }
    if legacy.return_token_ids:
        payload["prompt_token_ids"] = turn.prompt.ids
    return payload


async def _chunks(
    state: Any, turn: Turn, legacy: Legacy, model: str, first: Any, events: AsyncIterator, started: float
) -> AsyncIterator[bytes]:
    tok = state.renderer.tokenizer
    base = {
        "id": turn.response_id,
        "object": "text_completion",
        "created": turn.created,
        "model": model,
        "system_fingerprint": f"areal-v{state.engine.version}",
    }

    def chunk(
        index: int, text: str, ids: list[int], finish: str | None = None, logprobs: Any = None, **top: Any
    ) -> bytes:
        choice: dict[str, Any] = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        if legacy.return_token_ids:
            choice["token_ids"] = ids
        return sse({**base, **top, "choices": [choice]})

    n = turn.request.n
    builders = [_builder(state, turn) for _ in range(n)]
    offsets = [0] * n
    if legacy.echo or legacy.return_token_ids:
        prefix = echo_text(state, turn) if legacy.echo else ""
        offsets = [len(prefix)] * n
        top = {"prompt_token_ids": turn.prompt.ids} if legacy.return_token_ids else {}
        for i in range(n):
            yield chunk(i, prefix, [], **top)
    item = first
    try:
        while not isinstance(item, list):
            assert isinstance(item, ChoiceDelta)
            if item.token_ids:
                i = item.index
                text = builders[i].feed(item.token_ids).content
                logprobs = None
                if legacy.logprobs is not None:
                    logprobs, offsets[i] = token_logprobs(
                        tok, item.token_ids, item.logprobs, item.top_logprobs, offsets[i]
                    )
                if text or logprobs or legacy.return_token_ids:
                    yield chunk(i, text, item.token_ids, logprobs=logprobs)
            item = await anext(events)
    except APIError as exc:
        yield sse(exc.body())
        return
    results: list[ChoiceResult] = item
    state.observe_call("completions", started, results)
    for r in results:
        rest, reply = builders[r.index].finish(r.generation.finish_reason)
        yield chunk(r.index, rest.content, [], finish=reply.finish_reason)
    yield sse({**base, "choices": [], "usage": usage(turn, results)})
    yield b"data: [DONE]\n\n"
