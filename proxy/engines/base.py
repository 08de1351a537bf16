"""The engine protocol: token ids in, sampled token ids + logprobs + policy version out.

Every backend (the embedded transformers engine, SGLang, vLLM) speaks this one
interface, so the proxy never retokenizes: it renders the prompt itself, sends ids,
and records exactly the ids the engine sampled together with the logprob of each
under the distribution it was actually sampled from (temperature, top-p and top-k
applied, and a JSON schema's token mask) and the weight version that produced it.

A generation is consumed as a stream of `StreamDelta`s; the last one carries the
finish reason. `generate()` drains the stream into a `GenerationResult`.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


class EngineUnavailable(RuntimeError):
    """The engine cannot serve right now (not loaded, dead server, overloaded).

    The proxy answers it with 503 in OpenAI's error shape.
    """


class EngineRequestError(ValueError):
    """The engine rejected the request itself (e.g. prompt over the context length)."""


class InvalidSampling(EngineRequestError):
    """A sampling parameter no engine can honour; `param` names it. The proxy answers 400."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings; the matched one stays in output_ids
    stop_token_ids: tuple[int, ...] = ()  # stop tokens in addition to the model's EOS
    ignore_eos: bool = False
    top_logprobs: int = 0  # how many alternatives per token to return (0..20)
    json_schema: str | None = None  # the reply must be JSON matching this schema (serialized); see grammar.py
    grammar: str | None = None  # the reply must follow this llguidance Lark grammar (a required tool call)

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


SEED_RANGE = (-(2**63), 2**64)
"""Seeds a torch generator takes: [-2**63, 2**64)."""
MAX_TOP_K = 2**31 - 1
MAX_STOPS = 16
MAX_STOP_CHARS = 1024
MAX_TOP_LOGPROBS = 20


def check_sampling(params: SamplingParams) -> None:
    """Raise `InvalidSampling` for the first field outside what every engine can take.

    Engines call it before a request joins a batch: a value that only fails deep in a decode
    step (a 64-bit overflow in a tensor, a NaN temperature) would otherwise fail the whole step,
    every other request in it included.
    """

    def integer(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def finite(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    p = params
    if not integer(p.max_new_tokens) or p.max_new_tokens < 1:
        raise InvalidSampling(f"max_new_tokens must be a positive integer, got {p.max_new_tokens!r}", "max_tokens")
    if not finite(p.temperature) or p.temperature < 0:
        raise InvalidSampling(f"temperature must be a finite number >= 0, got {p.temperature!r}", "temperature")
    if not finite(p.top_p) or not 0 < p.top_p <= 1:
        raise InvalidSampling(f"top_p must be in (0, 1], got {p.top_p!r}", "top_p")
    if not integer(p.top_k) or not 0 <= p.top_k <= MAX_TOP_K:
        raise InvalidSampling(f"top_k must be an integer from 0 (off) to {MAX_TOP_K}, got {p.top_k!r}", "top_k")
    if p.seed is not None and (not integer(p.seed) or not SEED_RANGE[0] <= p.seed < SEED_RANGE[1]):
        raise InvalidSampling(f"seed must be an integer from -2**63 to 2**64 - 1, got {p.seed!r}", "seed")
    if len(p.stop) > MAX_STOPS or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in p.stop):
        raise InvalidSampling(
            f"stop takes at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} characters", "stop"
        )
    if not all(integer(t) and 0 <= t <= MAX_TOP_K for t in p.stop_token_ids):
        raise InvalidSampling("stop_token_ids must be token ids (non-negative integers)", "stop_token_ids")
    if not integer(p.top_logprobs) or not 0 <= p.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidSampling(f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
    if p.json_schema is not None and not isinstance(p.json_schema, str):
        raise InvalidSampling("json_schema must be a JSON schema serialized as a string", "response_format")
    if p.grammar is not None and not isinstance(p.grammar, str):
        raise InvalidSampling("grammar must be a Lark grammar as a string", "tool_choice")


@dataclass
class StreamDelta:
    """Tokens produced since the previous delta; the last delta has `finish_reason`."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None  # token id or stop string that ended it
    abort_message: str | None = None


def merge_deltas(deltas: list[StreamDelta]) -> StreamDelta:
    """Consecutive deltas as one, its finish the last one's: what a server sent in one burst."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    top = None
    if any(d.top_logprobs is not None for d in deltas):
        top = [row for d in deltas for row in (d.top_logprobs or [[] for _ in d.token_ids])]
    return StreamDelta(
        token_ids=[t for d in deltas for t in d.token_ids],
        logprobs=[x for d in deltas for x in d.logprobs],
        versions=[v for d in deltas for v in d.versions],
        top_logprobs=top,
        finish_reason=last.finish_reason,
        matched_stop=last.matched_stop,
        abort_message=last.abort_message,
    )


@dataclass
class GenerationResult:
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: FinishReason = "length"
    matched_stop: int | str | None = None
    abort_message: str | None = None

    def extend(self, delta: StreamDelta) -> None:
        self.output_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        self.versions.extend(delta.versions)
        if delta.top_logprobs is not None:
            if self.top_logprobs is None:
                self.top_logprobs = []
            self.top_logprobs.extend(delta.top_logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.matched_stop = delta.matched_stop
            self.abort_message = delta.abort_message


@dataclass(frozen=True)
class ModelInfo:
    """What the proxy needs to know about the model behind an engine."""

    model_path: str  # local directory or hub id the tokenizer is loaded from
    max_context: int
    eos_token_ids: tuple[int, ...]


@runtime_checkable
class Engine(Protocol):
    """What the proxy needs from an inference backend."""

    @property
    def version(self) -> int:
        """Current weight version (bumped by every `update_weights`)."""
        ...

    @property
    def info(self) -> ModelInfo: ...

    async def start(self) -> None:
        """Load the model / connect; return once requests can be served."""

    async def stop(self) -> None:
        """Abort what is in flight and release resources."""

    def stream(
        self,
        input_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        affinity: str | None = None,
        incremental: bool = True,
    ) -> AsyncIterator[StreamDelta]:
        """Generate from `input_ids`, yielding tokens as they are produced.

        `affinity` names a conversation (a session id): backends with several
        servers keep one affinity on one server so its prefix cache is reused.
        `incremental=False` says nobody watches tokens arrive: a remote backend
        may then answer in one delta (one plain request instead of a stream).
        Raises `EngineUnavailable` when the engine cannot serve and
        `EngineRequestError` when the request itself is invalid for the model.
        """
        ...

    async def update_weights(self, path: str, version: int, adapter: bool = False) -> None:
        """Load safetensors weights from `path` between decode steps; set `version`.

        In-flight requests are not dropped: tokens sampled after the swap carry the
        new version. With `adapter`, `path` is a LoRA adapter folder (peft's) applied onto the
        base weights: merged by the embedded engine, loaded by name on SGLang and vLLM.
        """

    async def health(self) -> dict[str, Any]:
        """A small status dict; raises `EngineUnavailable` when not serving."""
        ...


async def generate(
    engine: Engine,
    input_ids: list[int],
    params: SamplingParams,
    *,
    request_id: str,
    affinity: str | None = None,
) -> GenerationResult:
    """Drain `engine.stream` into one result."""
    result = GenerationResult()
    async for delta in engine.stream(input_ids, params, request_id=request_id, affinity=affinity):
        result.extend(delta)
    return result
