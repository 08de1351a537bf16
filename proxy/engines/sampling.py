"""Per-row sampling for a decode batch, returning each token's logprob under the
distribution it was actually drawn from.

Rows carry their own temperature, top-p, top-k and random generator (so a request
with a `seed` is reproducible whatever else shares its batch). The logprob of a
sampled token is taken from the processed distribution — logits / T, then top-k
and top-p filtering, renormalised — which is what an RL trainer must use as the
behaviour policy. Greedy rows (T = 0) report the untempered model distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from proxy.engines.base import SamplingParams


@dataclass
class Sampled:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]] | None]


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k / nucleus with -inf. logits (R, V); top_k, top_p (R,)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(-1)
    drop = ranks >= k
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop |= mass_before >= top_p.unsqueeze(-1)  # always keeps the first token
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def process_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Turn raw logits (R, V) into the log-distribution each row samples from."""
    logits = logits.float()
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=logits.device)
    logits = logits / temps.unsqueeze(-1)
    filtered = [i for i, p in enumerate(params) if not p.greedy and (p.top_p < 1.0 or p.top_k > 0)]
    if filtered:
        idx = torch.tensor(filtered, device=logits.device)
        top_k = torch.tensor([params[i].top_k for i in filtered], device=logits.device)
        top_p = torch.tensor([params[i].top_p for i in filtered], device=logits.device)
        logits[idx] = _filter_top_k_top_p(logits[idx], top_k, top_p)
    return torch.log_softmax(logits, dim=-1)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> Sampled:
    """Draw one token per row of `logits` (R, V)."""
    logprobs = process_logits(logits, params)
    # Exponential race: argmax(log p - log E) with E ~ Exp(1) draws from p. One batched
    # argmax for all rows; each seeded row fills its own noise from its own generator.
    noise = torch.empty_like(logprobs).exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    greedy = torch.tensor([p.greedy for p in params], device=logprobs.device)
    scores = torch.where(greedy.unsqueeze(-1), logprobs, logprobs - noise.log())
    chosen_ids = torch.argmax(scores, dim=-1)
    token_ids = chosen_ids.tolist()
    chosen = logprobs.gather(-1, chosen_ids.unsqueeze(-1)).squeeze(-1)
    tops: list[list[tuple[int, float]] | None] = [None] * len(params)
    want = max((p.top_logprobs for p in params), default=0)
    if want:
        values, indices = torch.topk(logprobs, k=want, dim=-1)
        for row, p in enumerate(params):
            if p.top_logprobs:
                n = p.top_logprobs
                tops[row] = list(zip(indices[row, :n].tolist(), values[row, :n].tolist()))
    return Sampled(token_ids=token_ids, logprobs=chosen.tolist(), top_logprobs=tops)
