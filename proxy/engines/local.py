"""The embedded engine: a transformers model with continuous batching in one thread.

Requests arrive from the event loop and queue for a worker thread, which owns the model and
runs a loop of continuous-batching steps (`proxy/engines/batch.py`: admission, prefill, decode,
sampling). Weight updates are applied between steps, so nothing in flight is dropped; every
token records the version that produced it. `pause()` parks the loop between steps (requests
wait, new ones queue, weight updates still apply) until `resume()`. Runs on cpu, cuda or npu
(torch_npu is imported only for npu); device and dtype handling lives in
`proxy/runtime/devices.py`.

No request can stop the engine. Sampling parameters and token ids are checked before a request
joins the queue, and a request whose sampling or stop check still raises in a step fails alone.
A fault of the step itself (out of memory, a kernel error) fails every request the engine holds
at once — queued, running, or taken for the next batch — and the worker restarts with an empty
batch and prefix cache (`/health` answers 503 "restarting" meanwhile, then counts `restarts`);
only faults that repeat faster than `_FAULTS_PER_MINUTE` stop it for good.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import torch

from proxy.engines.base import (
    EngineRequestError,
    EngineUnavailable,
    InvalidSampling,
    ModelInfo,
    SamplingParams,
    StreamDelta,
    check_sampling,
)
from proxy.engines.batch import ContinuousBatch, Request
from proxy.engines.config import EngineConfig
from proxy.engines.lean import FastForward
from proxy.engines.prefix_cache import BLOCK
from proxy.runtime.adapters import Adapter, load_adapter, merge
from proxy.runtime.devices import (
    DTYPES,
    DeviceUnavailable,
    check_fits,
    load_weights_file,
    model_load_options,
    release_freed_memory,
    select_device,
    warn_if_emulated_bf16,
)
from proxy.runtime.model_files import resolve_model

log = logging.getLogger(__name__)


@dataclass
class _WeightUpdate:
    state: dict[str, torch.Tensor] | None  # None: only a barrier, resolved between two steps
    version: int
    done: asyncio.Future
    loop: asyncio.AbstractEventLoop
    adapter: Adapter | None = None  # a LoRA adapter to merge into the base weights instead of `state`


class LocalEngine:
    """Engine protocol implementation on an in-process transformers model."""

    call_grammars = True  # holds a required tool call to its format by a grammar (SamplingParams.grammar)

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self._version = 0
        self._info: ModelInfo | None = None
        self.model: Any = None
        self.tokenizer: Any = None
        self._base_weights: dict[str, torch.Tensor] = {}  # adapted weights before any LoRA merge
        self._device = torch.device("cpu")
        self._waiting: deque[Request] = deque()
        self._updates: deque[_WeightUpdate] = deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._paused = False
        self._closed = False  # the worker has ended: nothing more is queued
        self._error: BaseException | None = None
        self._restarting: str | None = None  # the fault being recovered from
        self._fault_next = False  # inject_fault(): the next step raises
        self._faults: deque[float] = deque()  # when recent step faults happened
        self._vocab = 0
        self._fast: FastForward | None = None
        self.stats = {
            "steps": 0,
            "tokens": 0,
            "prefill_tokens": 0,
            "cached_prompt_tokens": 0,
            "requests": 0,
            "restarts": 0,
            "failed_requests": 0,
        }
        self._batch = ContinuousBatch(
            cfg.max_batch_size, cfg.prefix_cache_tokens, self._waiting, self._wake, self.stats, cfg.seed
        )

    # -- protocol -----------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            raise EngineUnavailable("engine not started")
        return self._info

    async def start(self) -> None:
        # The model is loaded, and every torch op runs, on the engine thread alone: two
        # threads with OpenMP teams on a small machine spin against each other.
        loop = asyncio.get_running_loop()
        ready: asyncio.Future = loop.create_future()
        self._thread = threading.Thread(target=self._run, args=(loop, ready), name="local-engine", daemon=True)
        self._thread.start()
        await ready

    async def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)

    async def health(self) -> dict[str, Any]:
        if self._error is not None or self._thread is None or not self._thread.is_alive():
            raise EngineUnavailable(f"local engine is not running: {self._error!r}")
        if self._restarting is not None:
            raise EngineUnavailable(f"local engine is restarting after a fault: {self._restarting}")
        return {
            "backend": "local",
            "version": self._version,
            "paused": self._paused,
            "running": self._batch.alive_count(),
            "waiting": len(self._waiting),
            "prefix_cache_tokens": len(self._batch.prefix) * BLOCK,
            **self.stats,
        }

    async def stream(
        self,
        input_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        affinity: str | None = None,
        incremental: bool = True,
    ) -> AsyncIterator[StreamDelta]:
        if self._thread is None or not self._thread.is_alive():
            raise EngineUnavailable(f"local engine is not running: {self._error!r}")
        if not input_ids:
            raise EngineRequestError("empty prompt")
        if len(input_ids) >= self.info.max_context:
            raise EngineRequestError(
                f"prompt of {len(input_ids)} tokens does not fit the context of {self.info.max_context}"
            )
        check_sampling(params)
        if not all(type(i) is int for i in input_ids) or min(input_ids) < 0 or max(input_ids) >= self._vocab:
            raise InvalidSampling(f"input ids must be token ids from 0 to {self._vocab - 1}", "input_ids")
        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator(device=self._device).manual_seed(params.seed)
        req = Request(
            input_ids=list(input_ids),
            params=params,
            request_id=request_id,
            loop=asyncio.get_running_loop(),
            out=asyncio.Queue(),
            generator=generator,
        )
        with self._wake:
            if self._closed:  # the worker ended after the check above: nobody would answer
                raise EngineUnavailable(f"local engine is not running: {self._error!r}")
            self._waiting.append(req)
            self._wake.notify()
        try:
            while True:
                delta = await req.out.get()
                if isinstance(delta, BaseException):
                    raise delta
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            req.cancelled = True  # consumer gone (client disconnect): free the row

    async def update_weights(self, path: str, version: int, adapter: bool = False) -> None:
        """Load full weights, or with `adapter` a LoRA adapter merged into the base weights (the ones
        loaded at start or by the last full update), between two decode steps."""
        if adapter:
            lora = await asyncio.to_thread(load_adapter, path)
            await self._between_steps(None, version, lora)
            return
        state = await asyncio.to_thread(load_weights_file, path)
        await self._between_steps(state, version)

    async def pause(self) -> int:
        """Stop decoding once the current step is done; returns the requests now held.

        Held and newly arriving requests keep their place and tokens; weight updates
        still apply while paused.
        """
        with self._wake:
            self._paused = True
        await self._between_steps(None, self._version)
        return self.in_flight

    def resume(self) -> None:
        with self._wake:
            self._paused = False
            self._wake.notify()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def in_flight(self) -> int:
        return self._batch.alive_count() + len(self._waiting)

    async def _between_steps(
        self, state: dict[str, torch.Tensor] | None, version: int, adapter: Adapter | None = None
    ) -> None:
        if self._thread is None or not self._thread.is_alive():
            raise EngineUnavailable(f"local engine is not running: {self._error!r}")
        loop = asyncio.get_running_loop()
        update = _WeightUpdate(state=state, version=version, done=loop.create_future(), loop=loop, adapter=adapter)
        with self._wake:
            if self._closed:
                raise EngineUnavailable(f"local engine is not running: {self._error!r}")
            self._updates.append(update)
            self._wake.notify()
        await update.done

    # -- loading ------------------------------------------------------------------
    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.cfg.threads > 0:
            torch.set_num_threads(self.cfg.threads)
        try:
            self._device = select_device(self.cfg.device)
        except DeviceUnavailable as exc:
            raise EngineUnavailable(str(exc)) from None
        options = model_load_options(self._device)
        path = resolve_model(self.cfg.model, self.cfg.cache_dir)
        dtype = DTYPES.get(self.cfg.dtype) or (torch.float32 if self._device.type == "cpu" else torch.bfloat16)
        warn_if_emulated_bf16(self._device, dtype == torch.bfloat16, "engine.dtype")
        t0 = time.perf_counter()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **options).to(self._device).eval()
        if self.cfg.fast_path == "auto" and self._device.type == "cpu" and FastForward.supports(self.model):
            self._fast = FastForward(self.model, self.cfg.quantize)
        elif self.cfg.quantize != "none":
            raise EngineUnavailable(
                f"engine.quantize = {self.cfg.quantize!r} needs a model the lean forward runs "
                f"(Llama, Mistral or Qwen2 layouts); {path} is not one"
            )
        release_freed_memory()  # what loading, converting and packing freed
        log.info(
            "loaded %s on %s (%s%s) in %.1fs",
            path,
            self._device,
            dtype,
            (", lean forward" if self._fast is not None else "")
            + (f", {self.cfg.quantize} weights" if self.cfg.quantize != "none" else ""),
            time.perf_counter() - t0,
        )
        eos = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(source)
        self._vocab = int(self.model.get_input_embeddings().num_embeddings)
        ctx = getattr(self.model.config, "max_position_embeddings", None) or 4096
        if self.cfg.context_length:
            ctx = min(ctx, self.cfg.context_length)
        self._info = ModelInfo(model_path=path, max_context=int(ctx), eos_token_ids=tuple(sorted(eos)))
        self._batch.bind(self.model, self.tokenizer, self._info, self._device, self._fast)

    # -- worker thread --------------------------------------------------------------
    def _run(self, loop: asyncio.AbstractEventLoop, ready: asyncio.Future) -> None:
        try:
            self._load()
        except BaseException as exc:
            self._error = exc
            loop.call_soon_threadsafe(_resolve, ready, exc)
            return
        loop.call_soon_threadsafe(_resolve, ready, None)
        try:
            with torch.inference_mode():
                self._serve()
        except BaseException as exc:  # the engine thread must report, never die silently
            log.exception("local engine stopped")
            self._error = exc
        finally:
            with self._wake:
                self._closed = True
            self._fail_all(EngineUnavailable(f"local engine stopped: {self._error!r}"))

    def _serve(self) -> None:
        """The worker's loop: wait for work, apply weight updates, step; recover from a faulty step."""
        worked, release_after = False, self.cfg.idle_release_s
        while True:
            if worked and release_after > 0:
                with self._wake:
                    idle = self._stays_idle(release_after)
                if idle:  # a while with nothing to do after a burst: keep the working set, not the peak
                    release_freed_memory()
                    worked = False
            with self._wake:
                while not self._called():
                    self._wake.wait()
                if self._stopping:
                    return
            self._apply_updates()
            if self._paused:
                continue
            worked = True
            try:
                self._step()
            except Exception as exc:
                self._recover(exc)

    def inject_fault(self) -> None:
        """Make the next step fail as a real fault would (`proxy.fault_injection`: chaos tests)."""
        self._fault_next = True

    def _step(self) -> None:
        if self._fault_next:
            self._fault_next = False
            raise RuntimeError("injected engine fault (POST /debug/engine-fault)")
        self._batch.step(self._version)

    def _recover(self, exc: Exception) -> None:
        """A step raised: nothing in it can be trusted. Fail every request held, empty the batch
        and the prefix cache, and go on; faults faster than `_FAULTS_PER_MINUTE` stop the engine."""
        now = time.monotonic()
        self._faults.append(now)
        while self._faults and now - self._faults[0] > 60:
            self._faults.popleft()
        self._restarting = f"{type(exc).__name__}: {exc}"[:500]
        held = self._fail_all(
            EngineUnavailable(f"the engine failed during this request ({self._restarting}) and is restarting")
        )
        log.error("engine step failed; %d requests failed, restarting the engine", held, exc_info=exc)
        self._batch.reset()
        gc.collect()
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
        release_freed_memory()
        if len(self._faults) > _FAULTS_PER_MINUTE:
            raise RuntimeError(f"{len(self._faults)} engine faults within a minute; last: {self._restarting}") from exc
        self.stats["restarts"] += 1
        self._restarting = None

    def _stays_idle(self, seconds: float) -> bool:
        """Whether nothing arrives for the engine thread in `seconds` (call with `_wake` held)."""
        deadline = time.monotonic() + seconds
        while not self._called():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self._wake.wait(left)
        return False

    def _called(self) -> bool:
        """Something for the engine thread to do (call with `_wake` held)."""
        return self._stopping or bool(self._updates) or self._has_work()

    def _has_work(self) -> bool:
        return not self._paused and bool(self._waiting or self._batch.running)

    def _fail_all(self, exc: BaseException) -> int:
        """Fail every request held (queued, taken for the batch, running); returns how many.
        Waiting weight updates are failed too once the engine is closed."""
        with self._wake:
            pending = list(self._waiting) + self._batch.release()
            self._waiting.clear()
            updates = list(self._updates) if self._closed else []
            if self._closed:
                self._updates.clear()
        failed = 0
        for req in pending:
            if not req.done:
                failed += self._batch.fail(req, exc)
        for u in updates:
            u.loop.call_soon_threadsafe(_resolve, u.done, exc)
        return failed

    def _apply_updates(self) -> None:
        while self._updates:
            update = self._updates.popleft()
            if update.state is None and update.adapter is None:
                update.loop.call_soon_threadsafe(_resolve, update.done, None)
                continue
            try:
                if update.adapter is not None:
                    self._merge_adapter(update.adapter)
                else:
                    check_fits(self.model.state_dict(), update.state)  # before loading: no half-applied update
                    self.model.load_state_dict(update.state, strict=False)
                    self._base_weights.clear()  # these are the new base for later adapters
                if self._fast is not None:
                    self._fast.refresh()
                self._version = update.version
                self._batch.prefix.clear()  # keys/values of the old weights
                result: BaseException | None = None
            except Exception as exc:  # report to the caller; the old weights stay in place
                result = exc
            update.loop.call_soon_threadsafe(_resolve, update.done, result)

    def _merge_adapter(self, adapter: Adapter) -> None:
        """Merge `adapter` into the base weights, copying each adapted base weight the first time (so
        every later adapter merges onto the same base, not onto the previous merge)."""
        params = self.model.state_dict()
        for key in adapter.pairs:
            if key not in self._base_weights and key in params:
                self._base_weights[key] = params[key].detach().clone()
        merged = merge(self._base_weights, adapter)  # raises before anything is loaded
        with torch.no_grad():
            for key, value in merged.items():
                params[key].copy_(value)


_FAULTS_PER_MINUTE = 5  # more step faults than this within a minute stop the engine


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
