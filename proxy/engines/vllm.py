"""vLLM backend: the OpenAI `/v1/completions` API with a token-id prompt.

Needs vLLM ≥ 0.10.2 for `return_token_ids` (the sampled ids, EOS included, per streamed
delta); written and checked against the 0.33.0 source. Each request asks for the sampled
token's logprob (`logprobs: k` returns it plus the k best alternatives, `k = 0` only it) with
tokens spelled `token_id:<id>`, keeps stop strings and special tokens, and asks for
`weight_versions` spans (0.33; older servers ignore the field). vLLM reports logprobs of the
raw model distribution unless the server runs with `--logprobs-mode processed_logprobs`,
which RL training wants (the distribution actually sampled from, temperature and top-p applied).
A JSON schema (`response_format`) goes as `structured_outputs: {json: schema}` (vLLM ≥ 0.12).

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

import json
from typing import Any

from proxy.engines.base import EngineRequestError, FinishReason, SamplingParams, StreamDelta
from proxy.engines.pool import Server, ServerError, WeightVersions, error_from_body, get_json, post_json, post_ok
from proxy.engines.remote import RemoteEngine, ServedModel, one_answer, sampling_fields

TOKEN_ID_PREFIX = "token_id:"
DEV_MODE_HINT = "vLLM's weight endpoints need the server started with VLLM_SERVER_DEV_MODE=1"


def build_completion_request(
    input_ids: list[int], params: SamplingParams, request_id: str, model: str | None, *, stream: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": list(input_ids),
        "max_tokens": params.max_new_tokens,
        **sampling_fields(params),
        "logprobs": params.top_logprobs,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "return_weight_versions": True,
        "include_stop_str_in_output": True,
        "n": 1,
        "stream": stream,
        "request_id": request_id,
    }
    if model:
        body["model"] = model
    if params.seed is not None:
        body["seed"] = params.seed
    if params.json_schema is not None:
        # vLLM ≥ 0.12 (`guided_json` before, removed in 0.12.0)
        body["structured_outputs"] = {"json": json.loads(params.json_schema)}
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
    return one_answer(decoder, body, "/v1/completions")


class VLLMEngine(RemoteEngine):
    """The `Engine` protocol over one or more vLLM OpenAI servers."""

    backend = "vllm"
    label = "vLLM"
    model_route = "/v1/models"
    generate_route = "/v1/completions"
    always_streams = True  # its per-token version spans come last

    async def _read_model(self, server: Server) -> ServedModel:
        answer = await get_json(self._http, server.url + "/v1/models")
        data = answer.get("data") if isinstance(answer, dict) else None
        card = data[0] if data else {}
        context = card.get("max_model_len")
        return ServedModel(
            names=(card.get("root"), card.get("id")),
            weight_version=await self._weight_version(server),
            served_id=card.get("id"),
            context=context if isinstance(context, int) else None,
        )

    async def _weight_version(self, server: Server) -> str | None:
        """`GET /weight_info` (dev mode only); None where the route is missing."""
        try:
            answer = await get_json(self._http, server.url + "/weight_info")
        except (ServerError, EngineRequestError):
            return None
        return answer.get("weight_version") if isinstance(answer, dict) else None

    def _build_request(
        self, input_ids: list[int], params: SamplingParams, request_id: str, *, stream: bool, adapter: str | None
    ) -> dict[str, Any]:
        # A loaded LoRA adapter is served as a model of its own name.
        return build_completion_request(input_ids, params, request_id, adapter or self.model_id, stream=stream)

    def _new_decoder(self, top_logprobs: int, versions: WeightVersions) -> CompletionDecoder:
        return CompletionDecoder(versions, top_logprobs=top_logprobs)

    async def _load_adapter(self, server: Server, name: str, path: str) -> None:
        """`POST /v1/load_lora_adapter` (the server runs with `--enable-lora`, a `--max-lora-rank` at least the
        trainer's rank, and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`)."""
        await post_ok(self._http, server.url + "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    async def _unload_adapter(self, server: Server, name: str) -> None:
        await post_ok(self._http, server.url + "/v1/unload_lora_adapter", {"lora_name": name})

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
