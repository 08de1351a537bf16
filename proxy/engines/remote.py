"""The `Engine` protocol over engine servers: what the SGLang and vLLM backends share.

`RemoteEngine` owns the `ServerPool`, one pooled HTTP client, the weight-version labels and
the model facts read at start-up. It streams each generation from a server the pool picks
(retried elsewhere until the first token), checks health, and fans a weight update out to
every live server, one update at a time. A backend subclass adds only its protocol: how a
server describes its model, how a request is built and its answer decoded, and how one
server loads new weights. What the servers do not report (context length, EOS ids) is read
from the model's own config files.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import aiohttp
import orjson

from proxy.engines.base import (
    EngineRequestError,
    EngineUnavailable,
    ModelInfo,
    SamplingParams,
    StreamDelta,
    check_sampling,
    merge_deltas,
)
from proxy.engines.config import EngineConfig
from proxy.engines.pool import (
    Poster,
    Server,
    ServerError,
    ServerPool,
    WeightVersions,
    decode_event,
    error_from_answer,
    http_client,
    sse_events,
    upstream_errors,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """What one server reports about the model it serves."""

    names: tuple[Any, ...]  # paths / hub ids, best first; the first is compared across servers
    weight_version: Any = None  # the server's weight-version label; None when it reports none
    served_id: str | None = None  # the id requests name the model by, where the protocol wants one
    context: int | None = None  # the context length, where this answer says it
    merges_adapters: bool = False  # takes a LoRA adapter folder as a weight update (`areal-proxy engine`)


class Decoder(Protocol):
    """A backend's answer decoder: each answer or streamed chunk in, the new tokens out."""

    finished: bool  # a chunk carried the finish reason

    def feed(self, chunk: dict[str, Any]) -> StreamDelta | None: ...


def one_answer(decoder: Decoder, body: Any, route: str) -> StreamDelta:
    """A non-streamed answer as one delta carrying the finish reason."""
    delta = decoder.feed(body) if isinstance(body, dict) else None
    if delta is None or not decoder.finished:
        raise ServerError(f"{route} answered without a finish reason: {str(body)[:200]}")
    return delta


def sampling_fields(params: SamplingParams) -> dict[str, Any]:
    """The sampling fields that SGLang's `sampling_params` and vLLM's completion body spell alike."""
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # -1 disables top-k on both
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "skip_special_tokens": False,
    }


class RemoteEngine(ABC):
    """The `Engine` protocol over one or more servers of one backend."""

    backend: ClassVar[str]  # the `engine.backend` name, reported by `health`
    label: ClassVar[str]  # the servers' software, in messages
    model_route: ClassVar[str]  # where a server describes its model (named when none answers)
    generate_route: ClassVar[str]  # where generations are requested
    always_streams: ClassVar[bool] = False  # stream even when nobody watches tokens arrive

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.pool = ServerPool(cfg.urls, retries=cfg.retries, dead_after_s=cfg.retry_dead_after_s)
        self.model_id: str | None = None  # the served model id requests name (`ServedModel.served_id`)
        self._versions = WeightVersions()
        self._client: aiohttp.ClientSession | None = None
        self._poster: Poster | None = None  # generations, over proxy.engines.http1
        self._info: ModelInfo | None = None
        self._update_lock = asyncio.Lock()
        self.merges_adapters = False  # every server merges adapters sent as weight updates
        self.adapters: list[tuple[str, int]] = []  # LoRA adapters loaded on the servers (name, version), newest last

    @property
    def version(self) -> int:
        return self._versions.current

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            raise EngineUnavailable(f"the {self.label} engine is not started")
        return self._info

    @property
    def _posts(self) -> Poster:
        if self._poster is None:
            raise EngineUnavailable(f"the {self.label} engine is not started")
        return self._poster

    @property
    def _http(self) -> aiohttp.ClientSession:
        if self._client is None:
            raise EngineUnavailable(f"the {self.label} engine is not started")
        return self._client

    # ---- the backend's protocol ----

    @abstractmethod
    async def _read_model(self, server: Server) -> ServedModel:
        """What `server` serves; raises `ServerError` / `EngineRequestError` when it cannot say."""

    async def _served_context(self, server: Server, model: ServedModel) -> tuple[int | None, int | None]:
        """(context length, KV-cache token capacity) of the first server that answered, if it says."""
        return model.context, None

    @abstractmethod
    def _build_request(
        self, input_ids: list[int], params: SamplingParams, request_id: str, *, stream: bool, adapter: str | None
    ) -> dict[str, Any]:
        """The body posted to `generate_route`; with `adapter`, one asking for that loaded LoRA adapter."""

    @abstractmethod
    def _new_decoder(self, top_logprobs: int, versions: WeightVersions) -> Decoder:
        """A decoder for one generation's answer, its tokens' versions read through `versions`."""

    @abstractmethod
    async def _update_server(self, server: Server, path: str, version: int) -> None:
        """Load the weights at `path` on `server` as `version` without dropping what is in flight."""

    @abstractmethod
    async def _load_adapter(self, server: Server, name: str, path: str) -> None:
        """Load the LoRA adapter at `path` on `server` under `name` (requests then name it)."""

    @abstractmethod
    async def _unload_adapter(self, server: Server, name: str) -> None:
        """Unload adapter `name` from `server`."""

    # ---- the engine ----

    async def start(self) -> None:
        self._client = http_client(self.cfg.timeout_s, self.cfg.api_key)
        self._poster = Poster(self.cfg.timeout_s, self.cfg.api_key)
        answers = await asyncio.gather(*(self._describe(s) for s in self.pool.servers))
        found = [(s, m) for s, m in zip(self.pool.servers, answers, strict=True) if m is not None]
        if not found:
            raise EngineUnavailable(f"no {self.label} server answered {self.model_route}: {self.pool.stats()}")
        if len({m.names[0] for _, m in found}) > 1:
            log.warning("%s servers serve different models: %s", self.label, [m.names[0] for _, m in found])
        for _, model in found:
            self._versions.to_int(model.weight_version)
        server, first = found[0]
        self.model_id = first.served_id
        self.merges_adapters = all(m.merges_adapters for _, m in found)
        served, kv_limit = await self._served_context(server, first)
        self._info = await resolve_model_info(
            list(first.names), self.cfg.model, served, kv_limit, cap=self.cfg.context_length
        )

    async def _describe(self, server: Server) -> ServedModel | None:
        """`_read_model`, or None with the server out of rotation when it cannot say."""
        try:
            return await self._read_model(server)
        except (ServerError, EngineRequestError) as exc:
            self.pool.mark_failed(server, str(exc))
            return None

    def stream(
        self,
        input_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        affinity: str | None = None,
        incremental: bool = True,
    ) -> AsyncIterator[StreamDelta]:
        check_sampling(params)  # what no server could take is refused here, before any server is tried
        streamed = incremental or self.always_streams
        # A request sampled with an adapter is sampled with it to the end: every token has its version.
        adapter = self.adapters[-1] if self.adapters else None
        versions = FixedVersion(adapter[1]) if adapter else self._versions
        body = self._build_request(
            input_ids, params, request_id, stream=streamed, adapter=adapter[0] if adapter else None
        )
        payload = orjson.dumps(body)
        poster = self._posts

        async def open_stream(server: Server) -> AsyncIterator[StreamDelta]:
            url = server.url + self.generate_route
            decoder = self._new_decoder(params.top_logprobs, versions)
            if not streamed:  # one JSON answer: cheaper than SSE when nobody watches tokens arrive
                yield one_answer(decoder, await poster.post_json(server.url, self.generate_route, payload), url)
                return
            with upstream_errors(url):
                async with poster.stream(server.url, self.generate_route, payload) as answer:
                    status = await answer.status()
                    if status >= 400:
                        raise error_from_answer(b"".join([data async for data in answer.chunks()]), status)
                    done = False
                    async for events in sse_events(answer.chunks()):
                        deltas = []
                        for data in events:
                            if done:
                                continue  # read to the end so the connection returns to the pool
                            if data == b"[DONE]":
                                done = True
                                continue
                            delta = decoder.feed(decode_event(data, url))
                            if delta is not None:
                                deltas.append(delta)
                        if deltas:  # one delta for what arrived together: each layer above runs once
                            yield merge_deltas(deltas)
            if not decoder.finished:
                raise ServerError(f"{url} ended the stream without a finish reason")

        return self.pool.stream(affinity, open_stream)

    async def update_weights(self, path: str, version: int, adapter: bool = False) -> None:
        """Update every live server concurrently (updates queue behind one another); a server that
        fails leaves rotation.

        With `adapter`, `path` is a LoRA adapter: it is loaded on every server under the name
        `areal-v{version}`, new requests name it, and adapters older than the previous one are
        unloaded (the previous one may still be finishing requests). A full update ends adapter use.
        Servers that merge adapters into their weights (`areal-proxy engine`) get the adapter as a
        weight update instead, their per-token versions exact as for full weights."""
        async with self._update_lock:
            if not adapter or self.merges_adapters:
                await self.pool.on_each_live(lambda s: self._update(s, path, version), "weight update")
                self.adapters.clear()
                return
            name = f"{ADAPTER_PREFIX}{version}"
            await self.pool.on_each_live(lambda s: self._load_adapter(s, name, path), "adapter load")
            self.adapters.append((name, version))
            self._versions.set(name, version)
            while len(self.adapters) > 2:
                old, _ = self.adapters.pop(0)
                await self.pool.on_each_live(lambda s, old=old: self._unload_quietly(s, old), "adapter unload")

    async def _unload_quietly(self, server: Server, name: str) -> None:
        try:
            await self._unload_adapter(server, name)
        except (ServerError, EngineRequestError) as exc:  # still in use, or the server restarted
            log.warning("could not unload adapter %s from %s: %s", name, server.url, exc)

    async def _update(self, server: Server, path: str, version: int) -> None:
        await self._update_server(server, path, version)
        self._versions.set(str(version), version)

    async def health(self) -> dict[str, Any]:
        await self.pool.check_health(self._http)
        return {"backend": self.backend, "version": self.version, "servers": self.pool.stats()}

    async def stop(self) -> None:
        """Close the idle connections and the client. A generation still in flight closes its own
        connection when its request is cancelled (uvicorn cancels them on shutdown), and its server
        aborts it."""
        if self._poster is not None:
            self._poster.close()
            self._poster = None
        if self._client is not None:
            await self._client.close()
            self._client = None


ADAPTER_PREFIX = "areal-v"


class FixedVersion(WeightVersions):
    """Every token is of one version: a request sampled with one LoRA adapter from start to end."""

    def __init__(self, version: int) -> None:
        super().__init__()
        self.current = version

    def to_int(self, label: Any) -> int:
        return self.current

    def per_token(self, spans: Any, label: Any, start: int, count: int) -> list[int]:
        return [self.current] * count


FALLBACK_CONTEXT = 4096  # when neither the server nor the model config names a context length


async def resolve_model_info(
    reported: list[Any], configured: str, served_context: int | None, kv_limit: int | None = None, *, cap: int = 0
) -> ModelInfo:
    """`ModelInfo` from what a server reports and the model's own config files.

    The tokenizer path is a reported path that exists here, else a reported hub id, else the
    configured model; the context length is the server's, else the config's, capped by the
    server's KV-cache capacity and by `cap` (`engine.context_length`) when set.
    """
    names = [str(p) for p in reported if p]
    local = [n for n in [*names, configured] if Path(n).expanduser().exists()]
    hub_ids = [n for n in names if not Path(n).is_absolute()]
    model_path = (local or hub_ids or [configured])[0]
    config_context, eos = await asyncio.to_thread(model_facts, model_path)
    max_context = served_context or config_context
    if not max_context:
        log.warning("context length of %s unknown; assuming %d", model_path, FALLBACK_CONTEXT)
        max_context = FALLBACK_CONTEXT
    for limit in (kv_limit, cap):
        if limit:
            max_context = min(max_context, limit)
    return ModelInfo(model_path=model_path, max_context=max_context, eos_token_ids=eos)


def model_facts(path: str) -> tuple[int | None, tuple[int, ...]]:
    """Context length and EOS ids from the model's config files (None / () when unreadable).

    Local files and the hub cache are read first; the hub is asked only for a non-local id,
    once: when that fails (offline, unknown id) the rest is read from the cache or skipped.
    """
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    local = Path(path).expanduser()
    online = not local.exists() and not local.is_absolute()  # a hub id, not another host's path
    loaded: dict[str, Any] = {}
    for loader in (AutoConfig, GenerationConfig, AutoTokenizer):
        for local_only in (True, False) if online else (True,):
            try:
                loaded[loader.__name__] = loader.from_pretrained(path, local_files_only=local_only)
                break
            except (OSError, ValueError, KeyError, ImportError) as exc:  # no such file, or offline
                if not local_only:
                    online = False
                    log.warning("could not read %s of %s: %s", loader.__name__, path, exc)
    max_context: int | None = None
    eos: list[int] = []
    if (config := loaded.get("AutoConfig")) is not None:
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            if isinstance(getattr(config, key, None), int):
                max_context = getattr(config, key)
                break
        eos += _ids(getattr(config, "eos_token_id", None))
    if (generation := loaded.get("GenerationConfig")) is not None:
        eos += _ids(generation.eos_token_id)
    if (tokenizer := loaded.get("AutoTokenizer")) is not None:
        eos += _ids(tokenizer.eos_token_id)
    return max_context, tuple(dict.fromkeys(eos))


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [v for v in value if isinstance(v, int)] if isinstance(value, list | tuple) else []
