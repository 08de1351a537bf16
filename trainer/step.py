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

from proxy.config import TrainerConfig
from trainer.batch import MicroBatch
from trainer.losses import loss_denominator, policy_loss, proximal_logprobs_interpolate


def target_logprobs(model: Any, mb: MicroBatch, device: torch.device) -> torch.Tensor:
    """log π(target) at loss positions; (B, T-1), zero elsewhere."""
    ids = mb.input_ids.to(device)
    hidden = model.base_model(input_ids=ids, attention_mask=mb.attention_mask.to(device)).last_hidden_state
    sel = mb.loss_mask.to(device)
    h = hidden[:, :-1][sel]  # (N, H)
    logits = model.get_output_embeddings()(h).float()  # (N, V)
    temps = mb.temperature.to(device)[:, None].expand_as(sel)[sel]
    logits = logits / temps[:, None]
    targets = mb.targets.to(device)[sel]
    picked = logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    out = torch.zeros(sel.shape, dtype=torch.float32, device=device)
    return out.masked_scatter(sel, picked)


def recompute_proximal(model: Any, batches: list[MicroBatch], device: torch.device) -> None:
    """Store the current policy's logprobs on each microbatch before several updates."""
    model.eval()
    with torch.no_grad():
        for mb in batches:
            mb.prox_logprobs = target_logprobs(model, mb, device).cpu()


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    tokens: int
    stats: dict[str, float]


def normaliser_for(batches: list[MicroBatch], loss_agg: str) -> float:
    if loss_agg == "token_sum_norm":  # Dr. GRPO: a constant, num_sequences × longest reply
        longest = max(int(mb.loss_mask.sum(-1).max()) for mb in batches)
        return float(sum(mb.loss_mask.shape[0] for mb in batches) * longest)
    return sum(loss_denominator(mb.loss_mask, loss_agg) for mb in batches)


def train_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batches: list[MicroBatch],
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
        total_loss += float(loss)
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
