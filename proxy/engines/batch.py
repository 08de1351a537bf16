"""Continuous batching: one step admits waiting requests, prefills them and decodes every running row.

The engine thread (`proxy/engines/local.py`) calls `ContinuousBatch.step` between weight updates.
A step takes waiting requests up to the batch's free rows (prompt starts come from the prefix
cache), prefills them and decodes one token for every running row; with the lean forward
(`proxy/engines/lean.py`, CPU Llama-family models, `engine.fast_path = "auto"`) both happen in one
pass over the weights and admitted rows are written into finished rows' KV slots in place,
otherwise prefills run as padded batches through transformers' forward before the decode. Each
row is sampled (among the tokens its grammar allows, for a request with a JSON schema: see
`proxy/engines/grammar.py`), checked for stop conditions and streamed back to its request's event
loop. A request whose sampling or stop check raises fails alone; anything else a step raises is a fault
of the step, for the engine to recover from.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from proxy.engines.base import EngineRequestError, InvalidSampling, ModelInfo, SamplingParams, StreamDelta
from proxy.engines.grammar import Grammars, Matcher
from proxy.engines.kv import BatchKV
from proxy.engines.lean import FastForward, Segment
from proxy.engines.prefix_cache import BLOCK, Block, PrefixCache, past_of
from proxy.engines.sampling import sample

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Request:
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
    matcher: Matcher | None = None  # where its reply is in its JSON schema's grammar (made at its first token)
    kv_version: int = -1  # the weights its prompt's keys/values were computed with


class ContinuousBatch:
    """The running batch of one engine thread: its rows, their KV and the prefix cache.

    Every method runs on the engine thread, except that `waiting` is shared with the event loop
    under `lock`.
    """

    def __init__(
        self,
        max_rows: int,
        prefix_cache_tokens: int,
        waiting: deque[Request],
        lock: threading.Condition,
        stats: dict[str, int],
        seed: int = 0,
    ) -> None:
        self._max_rows = max_rows
        self._seed = seed
        self._sampler: torch.Generator | None = None  # unseeded rows' draws (`engine.seed`)
        self._waiting = waiting
        self._lock = lock
        self._stats = stats
        self.running: list[Request | None] = []  # one per KV row; None: finished, not yet compacted
        self.taken: list[Request] = []  # out of the queue, not yet in the batch (this step's admissions)
        self.kv = BatchKV()
        self.prefix = PrefixCache(prefix_cache_tokens)
        self._model: Any = None
        self._tokenizer: Any = None
        self._info: ModelInfo | None = None
        self._device = torch.device("cpu")
        self._fast: FastForward | None = None
        self._version = 0
        self._grammars: Grammars | None = None  # built at the first request with a JSON schema

    def bind(self, model: Any, tokenizer: Any, info: ModelInfo, device: torch.device, fast: FastForward | None) -> None:
        """The loaded model to step (the engine thread loads it before its first step)."""
        self._model, self._tokenizer, self._info, self._device, self._fast = model, tokenizer, info, device, fast
        self._grammars = None
        if self._sampler is None or self._sampler.device != device:  # a reload after a fault draws on
            self._sampler = torch.Generator(device=device).manual_seed(self._seed)

    def step(self, version: int) -> None:
        """Admit, prefill and decode once; every token sampled is tagged with weights `version`."""
        self._version = version
        if self._fast is not None:
            self._fused_step()
        else:
            self._admit()
            if self.running:
                self._decode()
        self.taken = []

    def release(self) -> list[Request]:
        """Let go of every request the batch holds (taken, running) and return them (call with `lock` held)."""
        held = self.taken + [r for r in self.running if r is not None]
        self.taken = []
        self.running = []
        return held

    def reset(self) -> None:
        """Forget the KV and the prefix cache: after a faulty step nothing in them can be trusted."""
        self.kv = BatchKV()
        self.prefix.clear()

    def _take(self) -> tuple[dict[tuple[int, ...], list[Request]], list[tuple[list[Block], list[tuple[int, ...]]]]]:
        """Waiting requests up to the batch's free rows, by prompt, and the prefills they need.

        Identical prompts (the n samples of one task) are prefilled once. Prompts that begin
        with the same cached blocks (the prefix cache) share those keys/values and prefill only
        the rest; each such set is right-padded into chunks of at most `_PREFILL_TOKENS`
        tokens. Right padding needs no attention mask: causal attention keeps every real
        position exact, and the padded tail of each row's KV is cut off. Returns the requests
        by prompt and the (cached chain, prompts) of each prefill.
        """
        budget = self._max_rows - self.alive_count()
        taken = self.taken = []
        with self._lock:
            while budget > len(taken) and self._waiting:
                req = self._waiting.popleft()
                if not req.cancelled:
                    taken.append(req)
        by_prompt: dict[tuple[int, ...], list[Request]] = {}
        for req in taken:
            by_prompt.setdefault(tuple(req.input_ids), []).append(req)
        by_past: dict[int, tuple[list[Block], list[tuple[int, ...]]]] = {}
        for prompt in sorted(by_prompt, key=len):
            chain = self.prefix.match(prompt) if self.prefix.max_blocks else []
            by_past.setdefault(chain[-1].id if chain else 0, (chain, []))[1].append(prompt)
        return by_prompt, [(chain, chunk) for chain, prompts in by_past.values() for chunk in _prefill_chunks(prompts)]

    def _admit(self) -> None:
        """Prefill waiting requests, each chunk a forward of its own, and add them to the running batch."""
        by_prompt, prefills = self._take()
        admitted: list[Request] = []
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
            self.prefix.store(prompt, row)
            reqs = by_prompt[prompt]
            finished = self._emit(reqs, logits[i : i + 1].expand(len(reqs), -1))
            for req in reqs:
                req.kv_version = self._version
                if req not in finished:
                    admitted.append(req)
                    rows.append(row)

    def _join(self, admitted: list[Request], rows: list) -> None:
        """Add admitted requests to the running batch: written in place into the rows of finished
        sequences (and free rows at the end) when they fit, else in one rebuild of the batch."""
        if not admitted:
            return
        free = [i for i, r in enumerate(self.running) if r is None][: len(admitted)]
        slots = free + list(range(len(self.running), len(self.running) + len(admitted) - len(free)))
        if self.kv.put(rows, slots):
            for slot, req in zip(slots, admitted):
                if slot < len(self.running):
                    self.running[slot] = req
                else:
                    self.running.append(req)
            return
        keep = [i for i, r in enumerate(self.running) if r is not None]
        # one rebuild: dead rows dropped, new rows joined, room left for the batch to fill up in place
        self.kv.add(rows, keep=keep, row_capacity=self._max_rows)
        self.running = [self.running[i] for i in keep] + admitted

    def _fused_step(self) -> None:
        """One forward for the whole step (the lean path): a token for every running row and the
        prefills of newly admitted requests together, so the weights are read once per step."""
        by_prompt, prefills = self._take()
        self._drop_cancelled()
        segments: list[Segment] = []
        decode_mask = None
        if self.alive_count():
            decode_mask, positions = self.kv.step_inputs()
            ids = self._step_ids()
            additive = (1 - decode_mask[:, None, None, :]).to(self._model.dtype) * torch.finfo(self._model.dtype).min
            segments.append(Segment(ids=ids, positions=positions, mask=additive, layers=self.kv.cache.layers))
        elif self.running:
            self._compact()
        for chain, chunk in prefills:
            segments.append(self._prefill_segment(chunk, chain))
        if not segments:
            return
        logits = self._fast(segments)
        offset = 0
        if decode_mask is not None:
            self.kv.commit_step(decode_mask)
            self._stats["steps"] += 1
            offset = len(self.running)
            self._decoded(logits[:offset])
        admitted: list[Request] = []
        rows: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        for (_, chunk), segment in zip(prefills, segments[1 if decode_mask is not None else 0 :]):
            self._prefilled(chunk, logits[offset : offset + len(chunk)], segment.kv, by_prompt, admitted, rows)
            offset += len(chunk)
        self._join(admitted, rows)
        self._maybe_compact()

    def _prefill_segment(self, prompts: list[tuple[int, ...]], chain: list[Block]) -> Segment:
        done = len(chain) * BLOCK
        longest = len(prompts[-1]) - done
        pad = self._info.eos_token_ids[0] if self._info.eos_token_ids else 0
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
        self._stats["prefill_tokens"] += sum(len(p) - done for p in prompts)
        self._stats["cached_prompt_tokens"] += done * len(prompts)
        self._stats["requests"] += len(prompts)

    def _prefill(
        self, prompts: list[tuple[int, ...]], chain: list[Block]
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One forward over right-padded prompts after their shared cached blocks `chain`:
        last-position logits (P, V) and per-layer KV of the whole prompts."""
        done = len(chain) * BLOCK
        longest = len(prompts[-1]) - done
        pad = self._info.eos_token_ids[0] if self._info.eos_token_ids else 0
        ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, : len(prompt) - done] = torch.tensor(prompt[done:])
        last = sorted({len(p) - 1 - done for p in prompts})
        cache = DynamicCache(ddp_cache_data=past_of(chain, len(prompts))) if chain else DynamicCache()
        out = self._model(
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

    def alive_count(self) -> int:
        return sum(r is not None for r in self.running)

    def _decode(self) -> None:
        self._drop_cancelled()
        if not self.alive_count():
            self._compact()
            return
        mask, positions = self.kv.step_inputs()
        out = self._model(
            input_ids=self._step_ids(),
            attention_mask=mask,
            position_ids=positions,
            cache=self.kv.cache,
            use_cache=True,
        )
        self.kv.commit_step(mask)
        self._stats["steps"] += 1
        self._decoded(out.logits[:, -1])
        self._maybe_compact()

    def _drop_cancelled(self) -> None:
        for i, r in enumerate(self.running):
            if r is not None and r.cancelled:
                self.running[i] = None

    def _step_ids(self) -> torch.Tensor:
        """(B, 1): each row's last token; finished rows still in the batch are fed a pad token."""
        pad = self._info.eos_token_ids[0] if self._info.eos_token_ids else 0
        return torch.tensor([[r.last_token if r is not None else pad] for r in self.running], device=self._device)

    def _decoded(self, logits: torch.Tensor) -> None:
        """Sample the running rows' next tokens from `logits` (B, V) and retire finished rows."""
        rows = [i for i, r in enumerate(self.running) if r is not None]
        finished = self._emit([self.running[i] for i in rows], logits[rows] if len(rows) < len(logits) else logits)
        if finished:
            gone = {id(r) for r in finished}
            for i in rows:
                if id(self.running[i]) in gone:
                    self._keep_reply(i, self.running[i])
            self.running = [None if r is not None and id(r) in gone else r for r in self.running]

    def _keep_reply(self, slot: int, req: Request) -> None:
        """Put a finished row's full blocks (prompt and reply) in the prefix cache.

        An agent's next turn is its prompt and this reply plus the new messages: with the reply's
        blocks cached it prefills only what is new. The row holds the keys/values of the prompt and
        every sampled token but the last (never fed back); a row that outlived a weight update holds
        some of the old weights' and is left out.
        """
        if not self.prefix.max_blocks or req.kv_version != self._version or not req.generated:
            return
        seq = req.input_ids + req.generated[:-1]
        n = len(seq)
        if n // BLOCK <= len(req.input_ids) // BLOCK or int(self.kv.mask[slot].sum()) != n:
            return  # no new full block (the prompt's are cached at its prefill)
        self.prefix.store(
            seq,
            [
                (layer.keys[slot : slot + 1, :, -n:], layer.values[slot : slot + 1, :, -n:])
                for layer in self.kv.cache.layers
            ],
        )

    def _maybe_compact(self) -> None:
        dead = len(self.running) - self.alive_count()
        # Finished rows stay in the batch (fed a pad token, their rows reused by new requests)
        # until enough of them, or of the padding columns every row has, make a copy of the KV
        # worth it: compacting costs a full copy of every layer's cache.
        if (dead and (dead * 4 >= len(self.running) or not self.alive_count())) or self.kv.leading_padding() >= 32:
            self._compact()

    def _compact(self) -> None:
        keep = [i for i, r in enumerate(self.running) if r is not None]
        self.running = [self.running[i] for i in keep]
        self.kv.keep(keep)

    def _emit(self, reqs: list[Request], logits: torch.Tensor) -> list[Request]:
        """Sample one token per request, stream it, and return the requests that finished (or failed)."""
        try:
            allowed = self._allowed(reqs, logits.shape[-1])
            rows = _rows(
                sample(logits, [r.params for r in reqs], [r.generator for r in reqs], allowed, self._sampler), len(reqs)
            )
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
                if req.matcher is not None:
                    req.matcher.advance(token)
                reason, matched = self._finish(req, token)
            except Exception as exc:
                if not isinstance(exc, EngineRequestError):
                    exc = EngineRequestError(f"checking the stop conditions failed: {exc}")
                self.fail(req, exc)
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
        self._stats["tokens"] += len(reqs)
        return finished

    def _allowed(self, reqs: list[Request], vocab: int) -> list[torch.Tensor | None] | None:
        """Each request's (V,) mask of the tokens its grammar allows next (None: no grammar)."""
        if not any(r.params.json_schema or r.params.grammar for r in reqs):
            return None
        if self._grammars is None:
            self._grammars = Grammars(self._tokenizer, vocab, self._info.eos_token_ids)
        for r in reqs:
            if (r.params.json_schema or r.params.grammar) and r.matcher is None:
                r.matcher = self._grammars.matcher(r.params.json_schema, r.params.grammar)
        return [r.matcher.allowed() if r.matcher is not None else None for r in reqs]

    def _sample_one(self, req: Request, logits: torch.Tensor) -> tuple[int, float, Any] | None:
        try:
            return _rows(
                sample(logits, [req.params], [req.generator], self._allowed([req], logits.shape[-1]), self._sampler), 1
            )[0]
        except InvalidSampling as exc:
            self.fail(req, exc)
            return None
        except Exception as exc:
            log.warning("sampling failed for request %s: %s", req.request_id, exc)
            self.fail(req, EngineRequestError(f"sampling failed: {exc}"))
            return None

    def _finish(self, req: Request, token: int) -> tuple[Any, int | str | None]:
        p = req.params
        if not p.ignore_eos and token in self._info.eos_token_ids:
            return "stop", token
        if token in p.stop_token_ids:
            return "stop", token
        if p.stop:
            tail = self._tokenizer.decode(req.generated[-_stop_window(p.stop) :], skip_special_tokens=False)
            for s in p.stop:
                if s in tail:
                    return "stop", s
        if len(req.generated) >= p.max_new_tokens:
            return "length", None
        if len(req.input_ids) + len(req.generated) >= self._info.max_context:
            return "length", None
        return None, None

    def fail(self, req: Request, exc: BaseException) -> int:
        req.done = True
        self._stats["failed_requests"] += 1
        req.loop.call_soon_threadsafe(req.out.put_nowait, exc)
        return 1


_PREFILL_TOKENS = 4096  # padded tokens per prefill forward


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
