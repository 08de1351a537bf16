"""The embedded engine: a transformers model with continuous batching in one thread.

Requests arrive from the event loop; a worker thread owns the model and runs a loop of steps.
Each step takes waiting requests (prompt starts come from the prefix cache), prefills them and
decodes one token for every running row; with the lean forward (`proxy/engines/lean.py`, CPU
Llama-family models, `engine.fast_path = "auto"`) both happen in one pass over the weights and
admitted rows are written into finished rows' KV slots in place, otherwise prefills run as
padded batches through transformers' forward before the decode. Each row is sampled, checked
for stop conditions and streamed back to its request. Weight updates are applied between steps,
so nothing in flight is dropped; every token records the version that produced it. `pause()`
parks the loop between steps (requests wait, new ones queue, weight updates still apply) until
`resume()`. Runs on cpu, cuda or npu (torch_npu is imported only for npu); device and dtype
handling lives in `proxy/runtime/devices.py`.

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
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from proxy.engines.base import (
    EngineRequestError,
    EngineUnavailable,
    InvalidSampling,
    ModelInfo,
    SamplingParams,
    StreamDelta,
    check_sampling,
)
from proxy.engines.config import EngineConfig
from proxy.engines.kv import BatchKV
from proxy.engines.lean import FastForward, Segment
from proxy.engines.prefix_cache import BLOCK, Block, PrefixCache, past_of
from proxy.engines.sampling import sample
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


@dataclass(eq=False)
class _Request:
    input_ids: list[int]
    params: SamplingParams
    request_id: str
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    generator: torch.Generator | None
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    done: bool = False  # its last delta (or error) was sent
    last_token: int = 0


@dataclass
class _WeightUpdate:
    state: dict[str, torch.Tensor] | None  # None: only a barrier, resolved between two steps
    version: int
    done: asyncio.Future
    loop: asyncio.AbstractEventLoop


class LocalEngine:
    """Engine protocol implementation on an in-process transformers model."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self._version = 0
        self._info: ModelInfo | None = None
        self.model: Any = None
        self.tokenizer: Any = None
        self._device = torch.device("cpu")
        self._waiting: deque[_Request] = deque()
        self._updates: deque[_WeightUpdate] = deque()
        self._running: list[_Request | None] = []  # one per KV row; None: finished, not yet compacted
        self._taken: list[_Request] = []  # out of the queue, not yet in the batch (this step's admissions)
        self._kv = BatchKV()
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
        self._prefix = PrefixCache(cfg.prefix_cache_tokens)
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
            "running": self._alive_count(),
            "waiting": len(self._waiting),
            "prefix_cache_tokens": len(self._prefix) * BLOCK,
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
        req = _Request(
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

    async def update_weights(self, path: str, version: int) -> None:
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
        return self._alive_count() + len(self._waiting)

    async def _between_steps(self, state: dict[str, torch.Tensor] | None, version: int) -> None:
        if self._thread is None or not self._thread.is_alive():
            raise EngineUnavailable(f"local engine is not running: {self._error!r}")
        loop = asyncio.get_running_loop()
        update = _WeightUpdate(state=state, version=version, done=loop.create_future(), loop=loop)
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
            self._fast = FastForward(self.model)
        release_freed_memory()  # what loading, converting and packing freed
        log.info(
            "loaded %s on %s (%s%s) in %.1fs",
            path,
            self._device,
            dtype,
            ", lean forward" if self._fast is not None else "",
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
        self._info = ModelInfo(model_path=path, max_context=int(ctx), eos_token_ids=tuple(sorted(eos)))

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
        if self._fast is not None:
            self._fused_step()
        else:
            self._admit()
            if self._running:
                self._decode()
        self._taken = []

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
        self._kv = BatchKV()
        self._prefix.clear()
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
        return not self._paused and bool(self._waiting or self._running)

    def _fail_all(self, exc: BaseException) -> int:
        """Fail every request held (queued, taken for the batch, running); returns how many.
        Waiting weight updates are failed too once the engine is closed."""
        with self._wake:
            pending = list(self._waiting) + self._taken + [r for r in self._running if r is not None]
            self._waiting.clear()
            self._taken = []
            self._running = []
            updates = list(self._updates) if self._closed else []
            if self._closed:
                self._updates.clear()
        failed = 0
        for req in pending:
            if not req.done:
                failed += self._fail(req, exc)
        for u in updates:
            u.loop.call_soon_threadsafe(_resolve, u.done, exc)
        return failed

    def _fail(self, req: _Request, exc: BaseException) -> int:
        req.done = True
        self.stats["failed_requests"] += 1
        req.loop.call_soon_threadsafe(req.out.put_nowait, exc)
        return 1

    def _apply_updates(self) -> None:
        while self._updates:
            update = self._updates.popleft()
            if update.state is None:
                update.loop.call_soon_threadsafe(_resolve, update.done, None)
                continue
            try:
                check_fits(self.model.state_dict(), update.state)  # before loading: no half-applied update
                self.model.load_state_dict(update.state, strict=False)
                if self._fast is not None:
                    self._fast.refresh()
                self._version = update.version
                self._prefix.clear()  # keys/values of the old weights
                result: BaseException | None = None
            except Exception as exc:  # report to the caller; the old weights stay in place
                result = exc
            update.loop.call_soon_threadsafe(_resolve, update.done, result)

    def _take(self) -> tuple[dict[tuple[int, ...], list[_Request]], list[tuple[list[Block], list[tuple[int, ...]]]]]:
        """Waiting requests up to the batch's free rows, by prompt, and the prefills they need.

        Identical prompts (the n samples of one task) are prefilled once. Prompts that begin
        with the same cached blocks (the prefix cache) share those keys/values and prefill only
        the rest; each such set is right-padded into chunks of at most `_PREFILL_TOKENS`
        tokens. Right padding needs no attention mask: causal attention keeps every real
        position exact, and the padded tail of each row's KV is cut off. Returns the requests
        by prompt and the (cached chain, prompts) of each prefill.
        """
        budget = self.cfg.max_batch_size - self._alive_count()
        taken = self._taken = []
        with self._wake:
            while budget > len(taken) and self._waiting:
                req = self._waiting.popleft()
                if not req.cancelled:
                    taken.append(req)
        by_prompt: dict[tuple[int, ...], list[_Request]] = {}
        for req in taken:
            by_prompt.setdefault(tuple(req.input_ids), []).append(req)
        by_past: dict[int, tuple[list[Block], list[tuple[int, ...]]]] = {}
        for prompt in sorted(by_prompt, key=len):
            chain = self._prefix.match(prompt) if self._prefix.max_blocks else []
            by_past.setdefault(chain[-1].id if chain else 0, (chain, []))[1].append(prompt)
        return by_prompt, [(chain, chunk) for chain, prompts in by_past.values() for chunk in _prefill_chunks(prompts)]

    def _admit(self) -> None:
        """Prefill waiting requests, each chunk a forward of its own, and add them to the running batch."""
        by_prompt, prefills = self._take()
        admitted: list[_Request] = []
        rows: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        for chain, chunk in prefills:
            logits, kv = self._prefill(chunk, chain)
            self._prefilled(chunk, logits, kv, by_prompt, admitted, rows)
        self._join(admitted, rows)

    def _prefilled(self, chunk, logits, kv, by_prompt, admitted, rows) -> None:  # noqa: ANN001
        """A prefilled chunk: cache its blocks, sample each request's first token, and collect the
        requests (and their KV rows) that go on decoding."""
        for i, prompt in enumerate(chunk):
            row = [(k[i : i + 1, :, : len(prompt)], v[i : i + 1, :, : len(prompt)]) for k, v in kv]
            self._prefix.store(prompt, row)
            reqs = by_prompt[prompt]
            finished = self._emit(reqs, logits[i : i + 1].expand(len(reqs), -1))
            for req in reqs:
                if req not in finished:
                    admitted.append(req)
                    rows.append(row)

    def _join(self, admitted: list[_Request], rows: list) -> None:
        """Add admitted requests to the running batch: written in place into the rows of finished
        sequences (and free rows at the end) when they fit, else in one rebuild of the batch."""
        if not admitted:
            return
        free = [i for i, r in enumerate(self._running) if r is None][: len(admitted)]
        slots = free + list(range(len(self._running), len(self._running) + len(admitted) - len(free)))
        if self._kv.put(rows, slots):
            for slot, req in zip(slots, admitted):
                if slot < len(self._running):
                    self._running[slot] = req
                else:
                    self._running.append(req)
            return
        keep = [i for i, r in enumerate(self._running) if r is not None]
        # one rebuild: dead rows dropped, new rows joined, room left for the batch to fill up in place
        self._kv.add(rows, keep=keep, row_capacity=self.cfg.max_batch_size)
        self._running = [self._running[i] for i in keep] + admitted

    def _fused_step(self) -> None:
        """One forward for the whole step (the lean path): a token for every running row and the
        prefills of newly admitted requests together, so the weights are read once per step."""
        by_prompt, prefills = self._take()
        self._drop_cancelled()
        segments: list[Segment] = []
        decode_mask = None
        if self._alive_count():
            decode_mask, positions = self._kv.step_inputs()
            ids = self._step_ids()
            additive = (1 - decode_mask[:, None, None, :]).to(self.model.dtype) * torch.finfo(self.model.dtype).min
            segments.append(Segment(ids=ids, positions=positions, mask=additive, layers=self._kv.cache.layers))
        elif self._running:
            self._compact()
        for chain, chunk in prefills:
            segments.append(self._prefill_segment(chunk, chain))
        if not segments:
            return
        logits = self._fast(segments)
        offset = 0
        if decode_mask is not None:
            self._kv.commit_step(decode_mask)
            self.stats["steps"] += 1
            offset = len(self._running)
            self._decoded(logits[:offset])
        admitted: list[_Request] = []
        rows: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        for (_, chunk), segment in zip(prefills, segments[1 if decode_mask is not None else 0 :]):
            self._prefilled(chunk, logits[offset : offset + len(chunk)], segment.kv, by_prompt, admitted, rows)
            offset += len(chunk)
        self._join(admitted, rows)
        self._maybe_compact()

    def _prefill_segment(self, prompts: list[tuple[int, ...]], chain: list[Block]) -> Segment:
        done = len(chain) * BLOCK
        longest = len(prompts[-1]) - done
        pad = self.info.eos_token_ids[0] if self.info.eos_token_ids else 0
        ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, : len(prompt) - done] = torch.tensor(prompt[done:])
        self._count_prefill(prompts, done)
        return Segment(
            ids=ids.to(self._device),
            positions=(done + torch.arange(longest, device=self._device))[None].expand(len(prompts), -1),
            past=past_of(chain, len(prompts)) if chain else None,
            last=torch.tensor([len(p) - 1 - done for p in prompts], device=self._device),
        )

    def _count_prefill(self, prompts: list[tuple[int, ...]], done: int) -> None:
        self.stats["prefill_tokens"] += sum(len(p) - done for p in prompts)
        self.stats["cached_prompt_tokens"] += done * len(prompts)
        self.stats["requests"] += len(prompts)

    def _prefill(
        self, prompts: list[tuple[int, ...]], chain: list[Block]
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One forward over right-padded prompts after their shared cached blocks `chain`:
        last-position logits (P, V) and per-layer KV of the whole prompts."""
        done = len(chain) * BLOCK
        longest = len(prompts[-1]) - done
        pad = self.info.eos_token_ids[0] if self.info.eos_token_ids else 0
        ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, : len(prompt) - done] = torch.tensor(prompt[done:])
        last = sorted({len(p) - 1 - done for p in prompts})
        cache = DynamicCache(ddp_cache_data=past_of(chain, len(prompts))) if chain else DynamicCache()
        out = self.model(
            input_ids=ids.to(self._device),
            cache=cache,
            use_cache=True,
            logits_to_keep=torch.tensor(last, device=self._device),
        )
        column = {pos: j for j, pos in enumerate(last)}
        picks = torch.tensor([column[len(p) - 1 - done] for p in prompts], device=self._device)
        logits = out.logits[torch.arange(len(prompts), device=self._device), picks]
        self._count_prefill(prompts, done)
        return logits, [(layer.keys, layer.values) for layer in cache.layers]

    def _alive_count(self) -> int:
        return sum(r is not None for r in self._running)

    def _decode(self) -> None:
        self._drop_cancelled()
        if not self._alive_count():
            self._compact()
            return
        mask, positions = self._kv.step_inputs()
        out = self.model(
            input_ids=self._step_ids(),
            attention_mask=mask,
            position_ids=positions,
            cache=self._kv.cache,
            use_cache=True,
        )
        self._kv.commit_step(mask)
        self.stats["steps"] += 1
        self._decoded(out.logits[:, -1])
        self._maybe_compact()

    def _drop_cancelled(self) -> None:
        for i, r in enumerate(self._running):
            if r is not None and r.cancelled:
                self._running[i] = None

    def _step_ids(self) -> torch.Tensor:
        """(B, 1): each row's last token; finished rows still in the batch are fed a pad token."""
        pad = self.info.eos_token_ids[0] if self.info.eos_token_ids else 0
        return torch.tensor([[r.last_token if r is not None else pad] for r in self._running], device=self._device)

    def _decoded(self, logits: torch.Tensor) -> None:
        """Sample the running rows' next tokens from `logits` (B, V) and retire finished rows."""
        rows = [i for i, r in enumerate(self._running) if r is not None]
        finished = self._emit([self._running[i] for i in rows], logits[rows] if len(rows) < len(logits) else logits)
        if finished:
            gone = {id(r) for r in finished}
            self._running = [None if r is not None and id(r) in gone else r for r in self._running]

    def _maybe_compact(self) -> None:
        dead = len(self._running) - self._alive_count()
        # Finished rows stay in the batch (fed a pad token, their rows reused by new requests)
        # until enough of them, or of the padding columns every row has, make a copy of the KV
        # worth it: compacting costs a full copy of every layer's cache.
        if (dead and (dead * 4 >= len(self._running) or not self._alive_count())) or self._kv.leading_padding() >= 32:
            self._compact()

    def _compact(self) -> None:
        keep = [i for i, r in enumerate(self._running) if r is not None]
        self._running = [self._running[i] for i in keep]
        self._kv.keep(keep)

    def _emit(self, reqs: list[_Request], logits: torch.Tensor) -> list[_Request]:
        """Sample one token per request, stream it, and return the requests that finished (or failed)."""
        try:
            rows = _rows(sample(logits, [r.params for r in reqs], [r.generator for r in reqs]), len(reqs))
        except Exception:  # some request's sampling raised: find it, fail it alone, keep the others
            rows = [self._sample_one(r, logits[i : i + 1]) for i, r in enumerate(reqs)]
        version = self._version
        finished = []
        for req, row in zip(reqs, rows):
            if row is None:
                finished.append(req)
                continue
            token, logprob, top = row
            req.generated.append(token)
            req.last_token = token
            try:
                reason, matched = self._finish(req, token)
            except Exception as exc:
                self._fail(req, EngineRequestError(f"checking the stop conditions failed: {exc}"))
                finished.append(req)
                continue
            delta = StreamDelta(
                token_ids=[token],
                logprobs=[logprob],
                versions=[version],
                top_logprobs=[top] if req.params.top_logprobs else None,
                finish_reason=reason,
                matched_stop=matched,
            )
            if reason is not None:
                req.done = True
                finished.append(req)
            req.loop.call_soon_threadsafe(req.out.put_nowait, delta)
        self.stats["tokens"] += len(reqs)
        return finished

    def _sample_one(self, req: _Request, logits: torch.Tensor) -> tuple[int, float, Any] | None:
        try:
            return _rows(sample(logits, [req.params], [req.generator]), 1)[0]
        except Exception as exc:
            log.warning("sampling failed for request %s: %s", req.request_id, exc)
            self._fail(req, EngineRequestError(f"sampling failed: {exc}"))
            return None

    def _finish(self, req: _Request, token: int) -> tuple[Any, int | str | None]:
        p = req.params
        if not p.ignore_eos and token in self.info.eos_token_ids:
            return "stop", token
        if token in p.stop_token_ids:
            return "stop", token
        if p.stop:
            tail = self.tokenizer.decode(req.generated[-_stop_window(p.stop) :], skip_special_tokens=False)
            for s in p.stop:
                if s in tail:
                    return "stop", s
        if len(req.generated) >= p.max_new_tokens:
            return "length", None
        if len(req.input_ids) + len(req.generated) >= self.info.max_context:
            return "length", None
        return None, None


_PREFILL_TOKENS = 4096  # padded tokens per prefill forward
_FAULTS_PER_MINUTE = 5  # more step faults than this within a minute stop the engine


def _rows(sampled: Any, n: int) -> list[tuple[int, float, Any] | None]:
    """A sampled batch as (token, logprob, top logprobs) per row."""
    return [(sampled.token_ids[i], sampled.logprobs[i], sampled.top_logprobs[i]) for i in range(n)]


def _prefill_chunks(prompts: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """Group length-sorted prompts so each padded batch stays within the token budget."""
    chunks: list[list[tuple[int, ...]]] = []
    for prompt in prompts:
        if chunks and len(prompt) * (len(chunks[-1]) + 1) <= _PREFILL_TOKENS:
            chunks[-1].append(prompt)
        else:
            chunks.append([prompt])
    return chunks


def _stop_window(stops: tuple[str, ...]) -> int:
    """Tokens to decode when looking for a stop string (a token covers at least one char)."""
    return max(len(s) for s in stops) + 2


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
