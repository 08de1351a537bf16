"""`areal-proxy engine`: the embedded engine as its own server, speaking SGLang's native API.

Several proxies (or hosts) can then share engines through the proxy's `sglang` backend,
unchanged. The subset served is what RL clients use: `/generate` (token ids in; ids,
logprobs and per-token weight versions out; cumulative SSE chunks when streamed),
`/update_weights_from_disk`, `/pause_generation` + `/continue_generation`, `/model_info`,
`/server_info`, `/health` and `/health_generate`. Errors use SGLang's nested shape
`{"error": {"message", "type", "code", "retryable"}}`, in the body or as an in-stream event.

Pausing never drops work, whatever the mode: running and queued requests keep their tokens
and go on after `/continue_generation` (SGLang's "retract"/"in_place"; its "abort" mode would
end them). Weight versions are integers inside the engine and labels on the wire: an
int-like label is the version itself, any other label is given the next integer.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response, StreamingResponse

from proxy.config import Config
from proxy.engines.base import EngineRequestError, EngineUnavailable, SamplingParams, StreamDelta
from proxy.engines.local import LocalEngine
from proxy.errors import APIError
from proxy.routes.common import JsonRoute
from proxy.runtime.adapters import is_adapter
from proxy.schemas.common import validation_error
from proxy.schemas.engine import GenerateRequest, PauseGeneration, SGLangSampling, UpdateWeights
from proxy.sessions import bearer

log = logging.getLogger(__name__)

_CLAMPED_LOGPROB = -999999999.0  # JSON has no -inf; SGLang clamps to this


class RequestError(ValueError):
    """A request the engine cannot serve as sent: 400 in SGLang's error shape."""


class KeyRequired(PermissionError):
    """A call without the admin key, on a server that has one: 401 in SGLang's error shape."""


OPEN_PATHS = ("/health", "/health_generate")
"""What the engine server answers without its key (as SGLang's --api-key leaves health checks open)."""


def error_body(message: str, status: int) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": status, "retryable": status >= 500}}


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


@dataclass
class Job:
    """One sequence of a `/generate` call, and what it produced so far."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    started: float = field(default_factory=time.perf_counter)

    def add(self, delta: StreamDelta) -> None:
        self.ids += delta.token_ids
        self.logprobs += delta.logprobs
        self.versions += delta.versions
        self.tops += delta.top_logprobs or [[] for _ in delta.token_ids]
        if delta.finish_reason == "stop":
            self.finish = {"type": "stop", "matched": delta.matched_stop}
        elif delta.finish_reason == "length":
            self.finish = {"type": "length", "length": len(self.ids)}
        elif delta.finish_reason == "abort":
            self.finish = {"type": "abort", "message": delta.abort_message or "aborted"}


def parse_sampling(
    raw: SGLangSampling | None, prompt_len: int, max_context: int, top_logprobs: int
) -> tuple[SamplingParams, dict]:
    """SGLang `sampling_params` (validated) → engine params + text options."""
    raw = raw or SGLangSampling()
    if raw.top_k == 0:
        raise RequestError("top_k must be -1 (disable), or at least 1, got 0")
    stop = [raw.stop] if isinstance(raw.stop, str) else raw.stop or []
    params = SamplingParams(
        max_new_tokens=max_context - prompt_len if raw.max_new_tokens is None else raw.max_new_tokens,
        temperature=raw.temperature,
        top_p=raw.top_p,
        top_k=max(raw.top_k, 0),
        seed=raw.sampling_seed,
        stop=tuple(stop),
        stop_token_ids=tuple(raw.stop_token_ids or ()),
        ignore_eos=raw.ignore_eos,
        top_logprobs=top_logprobs,
    )
    return params, {"skip_special_tokens": raw.skip_special_tokens, "no_stop_trim": raw.no_stop_trim}


def _clamp(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _CLAMPED_LOGPROB


class EngineServer:
    """The LocalEngine plus what SGLang's wire format adds: labels, request parsing, answers."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.engine = LocalEngine(cfg.engine)
        self.labels: dict[int, str] = {}
        self.update_lock = asyncio.Lock()

    def label(self, version: int) -> str:
        return self.labels.get(version, str(version))

    def to_version(self, label: Any) -> int:
        """The engine version for a wire label: the label itself if int-like, else the next integer."""
        if label is None:
            return self.engine.version
        try:
            return int(str(label))
        except ValueError:
            return self.engine.version + 1

    # -- /generate ----------------------------------------------------------------
    def parse_generate(self, body: GenerateRequest) -> tuple[list[Job], bool]:
        """The jobs of a `/generate` body and whether it was a batch."""
        if (name := body.unsupported()) is not None:
            raise RequestError(f"{name} is not supported by the embedded engine")
        if (body.input_ids is None) == (body.text is None):
            raise RequestError("Either text or input_ids should be provided, but not both.")
        if body.input_ids is not None:
            batch = isinstance(body.input_ids[0], list)
            prompts = body.input_ids if batch else [body.input_ids]
        else:
            batch = isinstance(body.text, list)
            prompts = [self.engine.tokenizer.encode(t) for t in (body.text if batch else [body.text])]
        rids = body.rid if isinstance(body.rid, list) else [body.rid] * len(prompts)
        samplings = body.sampling_params if isinstance(body.sampling_params, list) else [body.sampling_params]
        samplings = samplings * len(prompts) if not isinstance(body.sampling_params, list) else samplings
        if len(rids) != len(prompts) or len(samplings) != len(prompts):
            raise RequestError("rid and sampling_params lists must match the number of prompts")
        start = body.logprob_start_len
        jobs = []
        for ids, rid, sampling in zip(prompts, rids, samplings, strict=True):
            if not ids:
                raise RequestError("input_ids must be a non-empty list of token ids")
            if isinstance(start, int) and 0 <= start < len(ids):
                raise RequestError("input token logprobs (logprob_start_len >= 0) are not supported")
            if len(ids) >= self.engine.info.max_context:
                raise RequestError(
                    f"The input ({len(ids)} tokens) is longer than the model's context length "
                    f"({self.engine.info.max_context} tokens)."
                )
            params, text = parse_sampling(sampling, len(ids), self.engine.info.max_context, body.top_logprobs_num)
            jobs.append(
                Job(rid=str(rid) if rid is not None else uuid.uuid4().hex, input_ids=ids, params=params, **text)
            )
        return jobs, batch

    async def run(self, job: Job) -> AsyncIterator[Job]:
        """Generate `job`, yielding it after every new token; the last one has its finish reason."""
        if job.params.max_new_tokens == 0:
            job.finish = {"type": "length", "length": 0}
            yield job
            return
        stream = self.engine.stream(job.input_ids, job.params, request_id=job.rid)
        async with aclosing(stream) as deltas:
            async for delta in deltas:
                job.add(delta)
                yield job

    def answer(self, job: Job, body: GenerateRequest) -> dict[str, Any]:
        """SGLang's `{"text", "output_ids", "meta_info"}` for the job as it stands (cumulative)."""
        meta: dict[str, Any] = {
            "id": job.rid,
            "finish_reason": job.finish,
            "prompt_tokens": len(job.input_ids),
            "completion_tokens": len(job.ids),
            "cached_tokens": 0,
            "weight_version": self.label(job.versions[-1] if job.versions else self.engine.version),
            "weight_versions": self.spans(job.versions),
            "e2e_latency": round(time.perf_counter() - job.started, 4),
        }
        if any(body.return_logprob) if isinstance(body.return_logprob, list) else body.return_logprob:
            with_text = body.return_text_in_logprobs
            meta["output_token_logprobs"] = [
                [_clamp(lp), i, self._token_text(i) if with_text else None]
                for lp, i in zip(job.logprobs, job.ids, strict=True)
            ]
            meta["output_token_logprobs_length"] = len(job.ids)
            if job.params.top_logprobs:
                meta["output_top_logprobs"] = [
                    [[_clamp(lp), i, self._token_text(i) if with_text else None] for i, lp in row] for row in job.tops
                ]
        return {"text": self.text(job), "output_ids": list(job.ids), "meta_info": meta}

    def spans(self, versions: list[int]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i, version in enumerate(versions):
            if out and out[-1]["_v"] == version:
                out[-1]["end"] = i + 1
            else:
                out.append({"_v": version, "version": self.label(version), "start": i, "end": i + 1})
        return [{k: v for k, v in span.items() if k != "_v"} for span in out]

    def text(self, job: Job) -> str:
        """Decoded output; the matched stop token or string is cut unless `no_stop_trim`."""
        ids = job.ids
        matched = (job.finish or {}).get("matched")
        if not job.no_stop_trim and isinstance(matched, int) and ids and ids[-1] == matched:
            ids = ids[:-1]
        text = self.engine.tokenizer.decode(ids, skip_special_tokens=job.skip_special_tokens)
        if not job.no_stop_trim and isinstance(matched, str) and (cut := text.find(matched)) >= 0:
            text = text[:cut]
        return text

    def _token_text(self, token: int) -> str:
        return self.engine.tokenizer.decode([token])

    async def generate(self, job: Job, body: GenerateRequest) -> dict[str, Any]:
        async for _ in self.run(job):
            pass
        return self.answer(job, body)

    async def stream_events(self, job: Job, body: GenerateRequest) -> AsyncIterator[bytes]:
        try:
            async for state in self.run(job):
                yield b"data: " + orjson.dumps(self.answer(state, body)) + b"\n\n"
        except EngineRequestError as exc:
            yield b"data: " + orjson.dumps(error_body(str(exc), 400)) + b"\n\n"
        except EngineUnavailable as exc:
            yield b"data: " + orjson.dumps(error_body(str(exc), 503)) + b"\n\n"
        yield b"data: [DONE]\n\n"

    # -- control ------------------------------------------------------------------
    def model_info(self) -> dict[str, Any]:
        path = self.engine.info.model_path
        return {
            "model_path": path,
            "tokenizer_path": path,
            "served_model_name": self.cfg.engine.model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.label(self.engine.version),
            "load_format": "safetensors",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "reasoning_parser": None,
            "tool_call_parser": None,
            # Not SGLang's: a LoRA adapter folder given to /update_weights_from_disk is merged into the
            # weights (per-token versions stay exact), so a proxy sends adapters there.
            "merges_lora_adapters": True,
        }

    def server_info(self) -> dict[str, Any]:
        return {
            **self.model_info(),
            "context_length": self.engine.info.max_context,
            "max_running_requests": self.cfg.engine.max_batch_size,
            "device": self.cfg.engine.device,
            "dtype": self.cfg.engine.dtype,
            "eos_token_ids": list(self.engine.info.eos_token_ids),
            "backend": "areal-proxy local engine",
            "internal_states": [{"paused": self.engine.paused, "in_flight": self.engine.in_flight}],
        }

    async def update_weights(self, body: UpdateWeights) -> tuple[dict[str, Any], int]:
        if body.abort_all_requests:
            return {"success": False, "message": "abort_all_requests is not supported", "num_paused_requests": 0}, 400
        async with self.update_lock:
            held = self.engine.in_flight if self.engine.paused else 0
            version = self.to_version(body.weight_version)
            try:
                adapter = is_adapter(body.model_path)
                await self.engine.update_weights(body.model_path, version, adapter=adapter)
            except (FileNotFoundError, ValueError, KeyError, OSError) as exc:
                message = f"Failed to update weights: {exc}. The previous weights stay loaded."
                return {"success": False, "message": message, "num_paused_requests": held}, 400
            if body.weight_version is not None:
                self.labels[version] = str(body.weight_version)
        log.info("weights from %s loaded as version %s", body.model_path, self.label(version))
        message = "Succeeded to update model weights."
        return {"success": True, "message": message, "num_paused_requests": held}, 200


def create_engine_app(cfg: Config) -> FastAPI:
    server = EngineServer(cfg)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await server.engine.start()  # the port opens once the model is loaded, as with SGLang
        # What start-up built (torch, transformers, the model's modules: ~480,000 objects with the default
        # model) goes to the collector's permanent generation, as in `areal-proxy serve`: a full pass over
        # it took 186 ms, a pause for every sequence in the batch.
        gc.freeze()
        log.info("engine ready: %s", server.engine.info.model_path)
        try:
            yield
        finally:
            await server.engine.stop()

    async def require_key(request: Request) -> None:
        if not cfg.proxy.admin_key or request.url.path in OPEN_PATHS:
            return
        try:
            token = bearer(request.headers.get("authorization"))
        except APIError as exc:
            raise KeyRequired(exc.message) from None
        if token is None or not hmac.compare_digest(token, cfg.proxy.admin_key):
            raise KeyRequired("this engine server needs its admin key as a bearer token")

    app = FastAPI(
        title="areal-proxy engine",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(require_key)],
    )
    app.router.route_class = JsonRoute
    app.state.server = server

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        return json_response(error_body(validation_error(list(exc.errors())).message, 400), 400)

    @app.exception_handler(KeyRequired)
    async def _no_key(_: Request, exc: KeyRequired) -> Response:
        return json_response(error_body(str(exc), 401), 401)

    @app.exception_handler(RequestError)
    async def _bad_request(_: Request, exc: RequestError) -> Response:
        return json_response(error_body(str(exc), 400), 400)

    @app.exception_handler(EngineRequestError)
    async def _rejected(_: Request, exc: EngineRequestError) -> Response:
        return json_response(error_body(str(exc), 400), 400)

    @app.exception_handler(EngineUnavailable)
    async def _unavailable(_: Request, exc: EngineUnavailable) -> Response:
        return json_response(error_body(str(exc), 503), 503)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(body: GenerateRequest) -> Response:
        jobs, batch = server.parse_generate(body)
        if body.stream:
            if batch:
                raise RequestError("streaming a batch of prompts is not supported by the embedded engine")
            return StreamingResponse(server.stream_events(jobs[0], body), media_type="text/event-stream")
        answers = await asyncio.gather(*(server.generate(job, body) for job in jobs))
        return json_response(answers if batch else answers[0])

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeights) -> Response:
        answer, status = await server.update_weights(body)
        return json_response(answer, status)

    @app.post("/pause_generation")
    async def pause_generation(body: PauseGeneration | None = None) -> Response:
        mode = (body or PauseGeneration()).mode
        held = await server.engine.pause()
        log.info("generation paused (mode %s): %d requests held", mode, held)
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> Response:
        server.engine.resume()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> Response:
        return json_response(server.model_info())

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> Response:
        return json_response(server.server_info())

    @app.get("/health")
    async def health() -> Response:
        return json_response(await server.engine.health())

    @app.get("/health_generate")
    async def health_generate() -> Response:
        await server.engine.health()
        job = Job(rid=f"health-{uuid.uuid4().hex}", input_ids=[0], params=SamplingParams(max_new_tokens=1))
        try:
            await asyncio.wait_for(server.generate(job, GenerateRequest()), timeout=60)
        except TimeoutError:
            return json_response(error_body("no token generated within 60 s (paused or overloaded)", 503), 503)
        return Response(status_code=200)

    return app


def serve_engine(cfg: Config, host: str, port: int) -> int:
    """Run the engine server until interrupted; 0 on a clean stop, 1 if it never started."""
    from proxy.servers.http import run_uvicorn

    app = create_engine_app(cfg)
    return run_uvicorn(app, host, port, cfg.proxy.log_level, admin_key=cfg.proxy.admin_key, what="the engine server")
