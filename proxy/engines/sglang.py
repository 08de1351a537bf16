"""SGLang backend: the native `/generate` API, token ids in, sampled ids + logprobs out.

Written and checked against the sglang 0.5.23 source; older servers are read too
(`/get_model_info` instead of `/model_info`, per-chunk `weight_version` where per-token
`weight_versions` spans are missing). Each request asks for the logprob of
every sampled token (`return_logprob`, `logprob_start_len: -1`) and keeps stop strings and
special tokens in place (`no_stop_trim`, `skip_special_tokens: false`); `output_ids` always
end with the matched stop token. A JSON schema (`response_format`) goes as the sampling param
`json_schema` (a string), which SGLang's grammar backend enforces. Streamed chunks are
cumulative unless the server runs with `--incremental-streaming-output`; `StreamDecoder`
detects which and yields deltas.

Weight updates pause every server with mode "retract", load the new weights from disk, and
continue (a server already reporting that version, loaded by another proxy replica sharing it,
is left alone). Retract moves running requests back to the waiting queue with their tokens so far
and drops their KV cache; on continue they are re-prefilled under the new weights and go on
sampling, so nothing in flight is lost and no stale KV is reused: while paused, the cache
flush of the update ignores the waiting queue. ("in_place" keeps the running batch, so that
flush fails and the scheduler asserts; "abort", the default, drops the requests; servers
older than the pause modes take "abort".)
"""

from __future__ import annotations

from typing import Any

from proxy.engines.base import EngineRequestError, FinishReason, SamplingParams, StreamDelta
from proxy.engines.pool import (
    Server,
    ServerError,
    WeightVersions,
    answer_json,
    error_from_body,
    get_json,
    http_errors,
    post_json,
    raise_for_status,
)
from proxy.engines.remote import RemoteEngine, ServedModel, one_answer, sampling_fields


def build_generate_request(
    input_ids: list[int], params: SamplingParams, request_id: str, *, stream: bool = True, adapter: str | None = None
) -> dict[str, Any]:
    """The `/generate` body; `sampling_params` keys must be ones SGLang knows (it rejects others)."""
    sampling: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,  # SGLang's default is 128
        **sampling_fields(params),
        "no_stop_trim": True,
    }
    if params.seed is not None:
        sampling["sampling_seed"] = params.seed
    if params.json_schema is not None:
        sampling["json_schema"] = params.json_schema  # a string: SGLang parses it itself
    body = {
        "input_ids": list(input_ids),
        "sampling_params": sampling,
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": params.top_logprobs,
        "return_text_in_logprobs": False,
        "rid": request_id,
        "stream": stream,
    }
    if adapter is not None:
        body["lora_path"] = adapter  # the name it was loaded under (`/load_lora_adapter`)
    return body


def parse_finish(reason: Any, last_token: int | None) -> tuple[FinishReason, int | str | None, str | None]:
    """`meta_info.finish_reason` → (finish reason, matched stop, abort message)."""
    kind = reason.get("type") if isinstance(reason, dict) else None
    if kind == "stop":
        matched = reason.get("matched")
        if isinstance(matched, list):  # a multi-token stop sequence
            matched = last_token if last_token in matched else (matched[0] if matched else None)
        return "stop", matched, None
    if kind == "length":
        return "length", None, None
    if kind == "abort":
        return "abort", None, str(reason.get("message") or "aborted by the engine")
    return "abort", None, f"unknown finish reason {reason!r}"


class StreamDecoder:
    """Turns `/generate` chunks (cumulative or incremental) into `StreamDelta`s.

    `incremental=None` detects the mode: cumulative chunks repeat every token so far, so
    their length equals `meta_info.completion_tokens` (or begins with the tokens seen).
    """

    def __init__(self, versions: WeightVersions, *, top_logprobs: int = 0, incremental: bool | None = None):
        self.versions = versions
        self.top_logprobs = top_logprobs
        self.incremental = incremental
        self.ids: list[int] = []
        self.finished = False

    def feed(self, chunk: dict[str, Any]) -> StreamDelta | None:
        if "error" in chunk:
            raise error_from_body(chunk, 500)
        meta = chunk.get("meta_info") or {}
        entries = meta.get("output_token_logprobs") or []
        ids = chunk.get("output_ids")
        ids = [int(e[1]) for e in entries] if ids is None else ids
        total = meta.get("output_token_logprobs_length", meta.get("completion_tokens"))
        seen = 0 if self._is_incremental(ids, total) else len(self.ids)
        new_ids = [int(i) for i in ids[seen:]]
        new_entries = entries[seen:]
        if [int(e[1]) for e in new_entries] != new_ids or any(e[0] is None for e in new_entries):
            raise ServerError(f"output_token_logprobs {new_entries!r} do not match output_ids {new_ids!r}")
        delta = StreamDelta(
            token_ids=new_ids,
            logprobs=[float(e[0]) for e in new_entries],
            versions=self.versions.per_token(
                meta.get("weight_versions"), meta.get("weight_version"), len(self.ids), len(new_ids)
            ),
            top_logprobs=self._top_logprobs(meta, seen, len(new_ids)),
        )
        self.ids += new_ids
        reason = meta.get("finish_reason")
        if reason is not None:
            self._finish(delta, reason)
        return delta if delta.token_ids or delta.finish_reason else None

    def _is_incremental(self, ids: list[int], total: Any) -> bool:
        if self.incremental is None and self.ids:  # the first chunk reads the same either way
            if isinstance(total, int):
                self.incremental = len(ids) != total
            else:
                self.incremental = list(ids[: len(self.ids)]) != self.ids
        return bool(self.incremental)

    def _top_logprobs(self, meta: dict[str, Any], seen: int, n: int) -> list[list[tuple[int, float]]] | None:
        """One row per new token (kept aligned even if a chunk omits them), best first."""
        if self.top_logprobs <= 0:
            return None
        if meta.get("output_top_logprobs") is None:
            return [[] for _ in range(n)]
        rows = meta["output_top_logprobs"][seen:]
        if len(rows) != n:
            raise ServerError(f"{len(rows)} output_top_logprobs rows for {n} new tokens")
        return [[(int(e[1]), float(e[0])) for e in (row or [])][: self.top_logprobs] for row in rows]

    def _finish(self, delta: StreamDelta, reason: Any) -> None:
        last = self.ids[-1] if self.ids else None
        delta.finish_reason, delta.matched_stop, delta.abort_message = parse_finish(reason, last)
        status = reason.get("status_code") if isinstance(reason, dict) else None
        if delta.finish_reason == "abort" and not self.ids and isinstance(status, int) and status < 500:
            raise EngineRequestError(delta.abort_message or "request rejected by the engine")
        self.finished = True


def parse_generate_body(
    body: dict[str, Any], versions: WeightVersions | None = None, *, top_logprobs: int = 0
) -> StreamDelta:
    """A non-streamed `/generate` answer as one delta carrying the finish reason."""
    return one_answer(StreamDecoder(versions or WeightVersions(), top_logprobs=top_logprobs), body, "/generate")


def _lookup(info: Any, key: str, depth: int = 2) -> Any:
    """`key` at the top of `info` or in its nested sections (server args may be grouped)."""
    if not isinstance(info, dict):
        return None
    if info.get(key) is not None:
        return info[key]
    for value in info.values():
        if depth and (found := _lookup(value, key, depth - 1)) is not None:
            return found
    return None


class SGLangEngine(RemoteEngine):
    """The `Engine` protocol over one or more SGLang servers."""

    backend = "sglang"
    label = "SGLang"
    model_route = "/model_info"
    generate_route = "/generate"

    async def _read_model(self, server: Server) -> ServedModel:
        answer = await self._model_info(server)
        names = (answer.get("model_path"), answer.get("tokenizer_path"))
        return ServedModel(
            names=names,
            weight_version=answer.get("weight_version"),
            merges_adapters=answer.get("merges_lora_adapters") is True,
        )

    async def _model_info(self, server: Server) -> dict[str, Any]:
        """`GET /model_info`, or `/get_model_info` on servers older than 0.5."""
        for path in ("/model_info", "/get_model_info"):
            url = server.url + path
            with http_errors(url):
                async with self._http.get(url) as response:
                    if response.status != 404:
                        await raise_for_status(response)
                        answer = answer_json(await response.read(), url)
                        if not isinstance(answer, dict):
                            raise ServerError(f"{url} answered {str(answer)[:200]}, not a JSON object")
                        return answer
        raise ServerError(f"{server.url} has neither /model_info nor /get_model_info")

    async def _served_context(self, server: Server, model: ServedModel) -> tuple[int | None, int | None]:
        """(context length, KV-cache token capacity) as the server reports them, if it does."""
        info: Any = None
        for path in ("/server_info", "/get_server_info"):
            try:
                info = await get_json(self._http, server.url + path)
                break
            except (ServerError, EngineRequestError):
                continue
        context = _lookup(info, "context_length")
        if not isinstance(context, int):
            try:
                models = await get_json(self._http, server.url + "/v1/models")
                context = (models.get("data") or [{}])[0].get("max_model_len")
            except (ServerError, EngineRequestError, AttributeError):
                context = None
        kv_limit = _lookup(info, "max_total_num_tokens")
        return (context if isinstance(context, int) else None), (kv_limit if isinstance(kv_limit, int) else None)

    def _build_request(
        self, input_ids: list[int], params: SamplingParams, request_id: str, *, stream: bool, adapter: str | None
    ) -> dict[str, Any]:
        return build_generate_request(input_ids, params, request_id, stream=stream, adapter=adapter)

    def _new_decoder(self, top_logprobs: int, versions: WeightVersions) -> StreamDecoder:
        return StreamDecoder(versions, top_logprobs=top_logprobs)

    async def _load_adapter(self, server: Server, name: str, path: str) -> None:
        """`POST /load_lora_adapter` (the server runs with `--enable-lora` and a `--max-lora-rank` at least
        the trainer's rank)."""
        answer = await post_json(self._http, server.url + "/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if isinstance(answer, dict) and answer.get("success") is False:
            raise EngineRequestError(f"{server.url} refused adapter {name}: {answer.get('error_message')}")

    async def _unload_adapter(self, server: Server, name: str) -> None:
        await post_json(self._http, server.url + "/unload_lora_adapter", {"lora_name": name})

    async def _update_server(self, server: Server, path: str, version: int) -> None:
        if await self._server_version(server) >= version:
            return  # another proxy replica sharing this server loaded these weights already
        await post_json(self._http, server.url + "/pause_generation", {"mode": "retract"})
        try:
            body = {"model_path": path, "weight_version": str(version), "abort_all_requests": False}
            answer = await post_json(self._http, server.url + "/update_weights_from_disk", body)
            if isinstance(answer, dict) and answer.get("success") is False:
                raise EngineRequestError(str(answer.get("message")))
        finally:
            await post_json(self._http, server.url + "/continue_generation", {})

    async def _server_version(self, server: Server) -> int:
        """The int-like weight version `server` reports; -1 when it reports none (or another label)."""
        try:
            label = (await self._model_info(server)).get("weight_version")
        except (ServerError, EngineRequestError):
            return -1
        try:
            return int(str(label))
        except ValueError:
            return -1
