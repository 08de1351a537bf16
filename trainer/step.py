"""One optimizer step of decoupled PPO over microbatches (gradient accumulation).

Logprobs are computed only where they are needed: the decoder runs over the
padded batch, then the LM head is applied to the hidden states of target
positions alone, so a long prompt costs activations but no (T × vocab) logits.
The proximal policy is the current one before this update: with a single
minibatch its logprobs equal the current logprobs detached (no second forward);
with `proximal = "interpolate"` they are approximated from the behaviour
logprobs and token versions; with "behaviour" the behaviour policy is used.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from proxy.config import TrainerConfig
from trainer.batch import PrefixGroup
from trainer.losses import loss_denominator, policy_loss, proximal_logprobs_interpolate


def target_logprobs(model: Any, group: PrefixGroup, device: torch.device) -> torch.Tensor:
    """log π(token) for every continuation position of a prefix group; (G, O), zero off the mask.

    The prefix runs once; its KV is expanded over the G continuations (gradients from
    every continuation flow back into the shared prefix activations).
    """
    prefix = group.prefix.to(device)[None]  # (1, P)
    cont = group.continuation.to(device)  # (G, O)
    g = cont.shape[0]
    cache = DynamicCache()
    head = model.base_model(input_ids=prefix, cache=cache, use_cache=True).last_hidden_state[:, -1:]  # (1, 1, H)
    shared = DynamicCache(
        ddp_cache_data=[
            (layer.keys.expand(g, -1, -1, -1), layer.values.expand(g, -1, -1, -1)) for layer in cache.layers
        ]
    )
    body = model.base_model(input_ids=cont, cache=shared, use_cache=True).last_hidden_state  # (G, O, H)
    hidden = torch.cat([head.expand(g, -1, -1), body[:, :-1]], dim=1)  # predicts cont[:, j] from position j-1
    sel = group.loss_mask.to(device)
    logits = model.get_output_embeddings()(hidden[sel]).float()  # (N, V)
    temps = group.temperature.to(device)[:, None].expand_as(sel)[sel]
    logits = logits / temps[:, None]
    targets = cont[sel]
    picked = logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    out = torch.zeros(sel.shape, dtype=torch.float32, device=device)
    return out.masked_scatter(sel, picked)


def recompute_proximal(model: Any, groups: list[PrefixGroup], device: torch.device) -> None:
    """Store the current policy's logprobs on each group before several updates."""
    model.eval()
    with torch.no_grad():
        for group in groups:
            group.prox_logprobs = target_logprobs(model, group, device).cpu()


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    tokens: int
    stats: dict[str, float]


def normaliser_for(batches: list[PrefixGroup], loss_agg: str) -> float:
    if loss_agg == "token_sum_norm":  # Dr. GRPO: a constant, num_sequences × longest reply
        longest = max(int(mb.loss_mask.sum(-1).max()) for mb in batches)
        return float(sum(mb.loss_mask.shape[0] for mb in batches) * longest)
    return sum(loss_denominator(mb.loss_mask, loss_agg) for mb in batches)


def train_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batches: list[PrefixGroup],
    cfg: TrainerConfig,
    device: torch.device,
    version: int,
    ref_model: Any = None,
) -> StepResult:
    model.train()
    optimizer.zero_grad(set_to_none=True)
    normaliser = normaliser_for(batches, cfg.loss_agg)
    autocast = (
        torch.autocast(device_type=device.type, dtype=torch.bfloat16) if cfg.autocast_bf16 else contextlib.nullcontext()
    )
    total_loss, tokens = 0.0, 0
    sums: dict[str, float] = {}
    for mb in batches:
        mask = mb.loss_mask.to(device)
        behav = mb.behav_logprobs.to(device)
        with autocast:
            logp = target_logprobs(model, mb, device)
        if mb.prox_logprobs is not None:
            prox = mb.prox_logprobs.to(device)
        elif cfg.proximal == "behaviour":
            prox = behav
        elif cfg.proximal == "interpolate":
            prox = proximal_logprobs_interpolate(behav, logp.detach(), mb.versions.to(device), version + 1, version)
        else:
            prox = logp.detach()
        ref = None
        if ref_model is not None and cfg.kl_coef > 0:
            with torch.no_grad(), autocast:
                ref = target_logprobs(ref_model, mb, device)
        loss, stats = policy_loss(
            logp,
            prox,
            behav,
            mb.advantages.to(device),
            mask,
            eps_clip=cfg.eps_clip,
            eps_clip_high=cfg.eps_clip_high,
            behav_cap=cfg.behav_cap,
            behav_cap_mode=cfg.behav_cap_mode,
            ratio_level=cfg.ratio_level,
            loss_agg=cfg.loss_agg,
            ref_logp=ref,
            kl_coef=cfg.kl_coef,
            normaliser=normaliser,
        )
        loss.backward()
        n = mb.num_tokens
        total_loss += float(loss.detach())
        tokens += n
        for key, value in stats.items():
            sums[key] = sums.get(key, 0.0) + float(value) * n
    params = [p for p in model.parameters() if p.grad is not None]
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
    optimizer.step()
    model.eval()
    return StepResult(
        loss=total_loss, grad_norm=grad_norm, tokens=tokens, stats={k: v / max(tokens, 1) for k, v in sums.items()}
    )
