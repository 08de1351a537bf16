"""vLLM backend: the OpenAI `/v1/completions` API with a token-id prompt.

Needs vLLM ≥ 0.10.2 for `return_token_ids` (the sampled ids, EOS included, per streamed
delta); written and checked against the 0.33.0 source. Each request asks for the sampled
token's logprob (`logprobs: k` returns it plus the k best alternatives, `k = 0` only it) with
tokens spelled `token_id:<id>`, keeps stop strings and special tokens, and asks for
`weight_versions` spans (0.33; older servers ignore the field). vLLM reports logprobs of the
raw model distribution unless the server runs with `--logprobs-mode processed_logprobs`,
which RL training wants (the distribution actually sampled from, temperature and top-p applied).

Weight updates use the dev-mode routes (`VLLM_SERVER_DEV_MODE=1`): `POST /pause?mode=keep`
freezes in-flight requests without dropping them; `POST /collective_rpc` runs the workers'
`reload_weights(weights_path=...)`, which loads a checkpoint directory in place (no weight
transfer engine, no NCCL group with the trainer); `POST /reset_prefix_cache?reset_running_requests=true`
moves the frozen requests back to the waiting queue and drops every KV block, so they are
recomputed under the new weights; `POST /update_weight_version` labels the new tokens; `/resume`.
The four-phase `/update_weights` protocol needs a trainer in the same NCCL/IPC group, so it is
not used. Pause modes and `reload_weights(weights_path=...)` are recent (checked in 0.33.0):
an older server may ignore `mode=keep` (and abort what is in flight) or fail the reload, which
raises. Write each version to a new directory: reloading a path read before may hit vLLM's
cached weights (vllm#32718).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from proxy.config import EngineConfig
from proxy.engines.base import (
    EngineRequestError,
    EngineUnavailable,
    FinishReason,
    ModelInfo,
    SamplingParams,
    StreamDelta,
)
from proxy.engines.pool import (
    JSON_HEADERS,
    Server,
    ServerError,
    ServerPool,
    WeightVersions,
    decode_event,
    error_from_body,
    get_json,
    http_client,
    http_errors,
    post_json,
    raise_for_status,
    resolve_model_info,
    sse_data,
)

log = logging.getLogger(__name__)

TOKEN_ID_PREFIX = "token_id:"
DEV_MODE_HINT = "vLLM's weight endpoints need the server started with VLLM_SERVER_DEV_MODE=1"


def build_completion_request(
    input_ids: list[int], params: SamplingParams, request_id: str, model: str | None, *, stream: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": list(input_ids),
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "logprobs": params.top_logprobs,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "return_weight_versions": True,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "n": 1,
        "stream": stream,
        "request_id": request_id,
    }
    if model:
        body["model"] = model
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def token_id(token: str) -> int:
    """The id in a `token_id:<id>` logprob token (asked for with `return_tokens_as_token_ids`)."""
    if not token.startswith(TOKEN_ID_PREFIX):
        raise ServerError(f"logprob token {token!r} is not 'token_id:<id>': return_tokens_as_token_ids ignored")
    return int(token[len(TOKEN_ID_PREFIX) :])


def parse_finish(
    finish: Any, stop_reason: Any, last_token: int | None
) -> tuple[FinishReason, int | str | None, str | None]:
    """`finish_reason` + `stop_reason` → (finish reason, matched stop, abort message).

    `stop_reason` is the stop string or stop token id, and None when the model's EOS ended it.
    """
    if finish == "stop":
        return "stop", last_token if stop_reason is None else stop_reason, None
    if finish == "repetition":  # repetition detection ended it: a stop without a matched stop
        return "stop", None, None
    if finish == "length":
        return "length", None, None
    if finish == "abort":
        return "abort", None, "aborted by the engine"
    return "abort", None, f"unknown finish reason {finish!r}"


class CompletionDecoder:
    """Turns `/v1/completions` answers or streamed chunks (deltas) into `StreamDelta`s."""

    def __init__(self, versions: WeightVersions, *, top_logprobs: int = 0):
        self.versions = versions
        self.top_logprobs = top_logprobs
        self.ids: list[int] = []
        self.finished = False

    def feed(self, chunk: dict[str, Any]) -> StreamDelta | None:
        if "error" in chunk or chunk.get("object") == "error":
            raise error_from_body(chunk, 500)
        choices = chunk.get("choices") or []
        if not choices:  # the usage chunk at the end of a stream
            return None
        choice = choices[0]
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        ids = choice.get("token_ids")
        ids = [token_id(t) for t in tokens] if ids is None else [int(i) for i in ids]
        values = logprobs.get("token_logprobs") or []
        if len(values) != len(ids) or any(v is None for v in values):
            raise ServerError(f"token_logprobs {values!r} do not match token_ids {ids!r}")
        if tokens and [token_id(t) for t in tokens] != ids:
            raise ServerError(f"logprob tokens {tokens!r} do not match token_ids {ids!r}")
        delta = StreamDelta(
            token_ids=ids,
            logprobs=[float(v) for v in values],
            versions=self.versions.per_token(choice.get("weight_versions"), None, len(self.ids), len(ids)),
            top_logprobs=self._top_logprobs(logprobs.get("top_logprobs"), len(ids)),
        )
        self.ids += ids
        finish = choice.get("finish_reason")
        if finish is not None:
            last = self.ids[-1] if self.ids else None
            delta.finish_reason, delta.matched_stop, delta.abort_message = parse_finish(
                finish, choice.get("stop_reason"), last
            )
            self.finished = True
        return delta if delta.token_ids or delta.finish_reason else None

    def _top_logprobs(self, rows: Any, n: int) -> list[list[tuple[int, float]]] | None:
        """The best `top_logprobs` per token; vLLM's dicts also hold the sampled token."""
        if self.top_logprobs <= 0:
            return None
        if rows is None:
            return [[] for _ in range(n)]
        if len(rows) != n:
            raise ServerError(f"{len(rows)} top_logprobs rows for {n} tokens")
        out = []
        for row in rows:
            pairs = sorted(((token_id(t), float(lp)) for t, lp in (row or {}).items()), key=lambda p: -p[1])
            out.append(pairs[: self.top_logprobs])
        return out


def parse_completion_body(
    body: dict[str, Any], versions: WeightVersions | None = None, *, top_logprobs: int = 0
) -> StreamDelta:
    """A non-streamed `/v1/completions` answer as one delta carrying the finish reason."""
    decoder = CompletionDecoder(versions or WeightVersions(), top_logprobs=top_logprobs)
    delta = decoder.feed(body)
    if delta is None or not decoder.finished:
        raise ServerError(f"/v1/completions answered without a finish reason: {str(body)[:200]}")
    return delta


class VLLMEngine:
    """The `Engine` protocol over one or more vLLM OpenAI servers."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.pool = ServerPool(cfg.urls, retries=cfg.retries, dead_after_s=cfg.retry_dead_after_s)
        self._versions = WeightVersions()
        self._client: aiohttp.ClientSession | None = None
        self._info: ModelInfo | None = None
        self._model: str | None = None  # the served model id requests name
        self._update_lock = asyncio.Lock()

    @property
    def version(self) -> int:
        return self._versions.current

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            raise EngineUnavailable("the vLLM engine is not started")
        return self._info

    @property
    def _http(self) -> aiohttp.ClientSession:
        if self._client is None:
            raise EngineUnavailable("the vLLM engine is not started")
        return self._client

    async def start(self) -> None:
        self._client = http_client(self.cfg.timeout_s)
        cards = await asyncio.gather(*(self._model_card(s) for s in self.pool.servers))
        found = [(s, c) for s, c in zip(self.pool.servers, cards, strict=True) if c is not None]
        if not found:
            raise EngineUnavailable("no vLLM server answered /v1/models: " + str(self.pool.stats()))
        if len({c.get("root") for _, c in found}) > 1:
            log.warning("vLLM servers serve different models: %s", [c.get("root") for _, c in found])
        card = found[0][1]
        self._model = card.get("id")
        for server, _ in found:
            self._versions.to_int(await self._weight_version(server))
        served = card.get("max_model_len")
        reported = [card.get("root"), card.get("id")]
        self._info = await resolve_model_info(reported, self.cfg.model, served if isinstance(served, int) else None)

    async def _model_card(self, server: Server) -> dict[str, Any] | None:
        try:
            answer = await get_json(self._http, server.url + "/v1/models")
        except (ServerError, EngineRequestError) as exc:
            self.pool.mark_failed(server, str(exc))
            return None
        data = answer.get("data") if isinstance(answer, dict) else None
        return data[0] if data else {}

    async def _weight_version(self, server: Server) -> str | None:
        """`GET /weight_info` (dev mode only); None where the route is missing."""
        try:
            answer = await get_json(self._http, server.url + "/weight_info")
        except (ServerError, EngineRequestError):
            return None
        return answer.get("weight_version") if isinstance(answer, dict) else None

    def stream(
        self,
        input_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        affinity: str | None = None,
        incremental: bool = True,  # vLLM is always streamed: its per-token version spans come last
    ) -> AsyncIterator[StreamDelta]:
        payload = orjson.dumps(build_completion_request(input_ids, params, request_id, self._model))
        client = self._http

        async def open_stream(server: Server) -> AsyncIterator[StreamDelta]:
            decoder = CompletionDecoder(self._versions, top_logprobs=params.top_logprobs)
            url = server.url + "/v1/completions"
            with http_errors(url):
                async with client.post(url, data=payload, headers=JSON_HEADERS) as response:
                    await raise_for_status(response)
                    done = False
                    async for data in sse_data(response.content.iter_any()):
                        if done:
                            continue  # read to the end so the connection returns to the pool
                        if data == "[DONE]":
                            done = True
                            continue
                        delta = decoder.feed(decode_event(data, url))
                        if delta is not None:
                            yield delta
            if not decoder.finished:
                raise ServerError(f"{url} ended the stream without a finish reason")

        return self.pool.stream(affinity, open_stream)

    async def update_weights(self, path: str, version: int) -> None:
        async with self._update_lock:
            await self.pool.on_each_live(lambda s: self._update_server(s, path, version), "weight update")

    async def _update_server(self, server: Server, path: str, version: int) -> None:
        base = server.url
        try:
            await post_json(self._http, base + "/pause", params={"mode": "keep"})
        except EngineRequestError as exc:
            raise EngineRequestError(f"{exc} ({DEV_MODE_HINT})") from exc
        try:
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": path, "is_checkpoint_format": True}}
            await post_json(self._http, base + "/collective_rpc", rpc)
            reset = await post_json(self._http, base + "/reset_prefix_cache", params={"reset_running_requests": "true"})
            if isinstance(reset, dict) and reset.get("success") is False:
                raise ServerError("the prefix cache could not be reset after the reload")
            await post_json(self._http, base + "/update_weight_version", {"new_version": str(version)})
        finally:
            await post_json(self._http, base + "/resume")
        self._versions.set(str(version), version)

    async def health(self) -> dict[str, Any]:
        await self.pool.check_health(self._http)
        return {"backend": "vllm", "version": self.version, "servers": self.pool.stats()}

    async def stop(self) -> None:
        """Close the connections; vLLM aborts the requests whose streams were closed."""
        if self._client is not None:
            await self._client.close()
            self._client = None
