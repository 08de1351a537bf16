"""Supervised fine-tuning on the store's own episodes: rejection-sampling fine-tuning.

With `trainer.algorithm = "sft"` a step trains the claimed sessions whose reward reaches `sft.min_reward` with the
mean negative log-likelihood of their sampled tokens (`losses.sft_loss`): rejection-sampling fine-tuning (RFT,
Yuan et al. 2023, arXiv 2308.01825; with `per_group = 1` best-of-n, RAFT, Dong et al. 2023, arXiv 2304.06767).
`KeepAccepted` replaces PPO's group advantages in batch selection: every session it leaves out is recorded with
its reason, as the other selectors' are. Logprobs are the model's own (temperature 1), whatever temperature
sampled the tokens: fine-tuning moves the model, not its sampler. Claims, checkpoints and weight pushes are the
trainer loop's, unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from proxy.store.samples import SessionSamples
from trainer.batch import PrefixGroup, Sample, build_samples, pack
from trainer.config import TrainerConfig
from trainer.losses import sft_loss
from trainer.memory import microbatch_budget
from trainer.policy import Reference
from trainer.selection import Selection, Selector, ShapeOverlong
from trainer.step import StepResult, apply_gradients, autocast_for, group_logprobs, microbatches

BELOW = "skipped_below_threshold"
NOT_BEST = "skipped_not_best"
DUPLICATE = "skipped_duplicate"


def accepted(
    sessions: list[SessionSamples], min_reward: float, per_group: int, distinct: bool
) -> tuple[list[int], dict[int, tuple[str, str]]]:
    """(indices of the sessions to train, {index: (counted_as, reason)} of the rest), group by group: a session
    passes with reward >= min_reward; with `distinct` a group's later copy of an episode (same tokens) is dropped;
    with `per_group` only that many pass per group, highest reward first (earliest first among equals)."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(sessions):
        groups.setdefault(s.group_id, []).append(i)
    left_out: dict[int, tuple[str, str]] = {}
    for members in groups.values():
        passing = []
        seen: set[tuple] = set()
        for i in members:
            s = sessions[i]
            key = tuple((tuple(x.prompt_ids), tuple(x.output_ids)) for x in s.individual)
            if s.reward < min_reward:
                left_out[i] = (BELOW, f"reward {s.reward:g} below sft.min_reward {min_reward:g}")
            elif distinct and key in seen:
                left_out[i] = (DUPLICATE, "the same episode as another of its group, trained once")
            else:
                seen.add(key)
                passing.append(i)
        if per_group:
            ranked = sorted(passing, key=lambda i: -sessions[i].reward)  # stable: earliest first among equals
            for i in ranked[per_group:]:
                left_out[i] = (NOT_BEST, f"not among its group's {per_group} best (sft.per_group)")
    return [i for i in range(len(sessions)) if i not in left_out], left_out


class KeepAccepted:
    """Rejection sampling as a selector: only the sessions `accepted` passes stay; the rest are skipped and counted."""

    def __init__(self, min_reward: float, per_group: int, distinct: bool) -> None:
        self.min_reward, self.per_group, self.distinct = min_reward, per_group, distinct

    def apply(self, claim: Selection) -> None:
        _, left_out = accepted(claim.sessions, self.min_reward, self.per_group, self.distinct)
        by_reason: dict[tuple[str, str], list[str]] = {}
        for i, why in left_out.items():
            by_reason.setdefault(why, []).append(claim.sessions[i].session_id)
        for name in (BELOW, DUPLICATE, NOT_BEST):
            claim.counts[name] = sum(len(ids) for (counted, _), ids in by_reason.items() if counted == name)
        for (counted_as, reason), ids in by_reason.items():
            claim.skip(counted_as, ids, reason)


def response_samples(sessions: list[SessionSamples], style: str) -> list[list[Sample]]:
    """Each session's samples in `style` (`trainer/batch.py`) with their loss mask over its sampled tokens, at
    temperature 1 (the model's own distribution); their advantages are unused."""
    out = []
    for s in sessions:
        samples = build_samples([s], style, {s.session_id: 0.0}, {s.session_id: 1.0})
        out.append([replace(x, temperature=1.0) for x in samples])
    return out


def sft_step(
    model: Any, optimizer: torch.optim.Optimizer, groups: list[PrefixGroup], cfg: TrainerConfig, device: torch.device
) -> StepResult:
    """One optimizer step of the token-mean NLL over every trained token of `groups`, accumulated over passes of
    at most `batch.tokens_per_microbatch` tokens."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    normaliser = float(sum(g.num_tokens for g in groups))
    total, nll_sum = 0.0, 0.0
    for chunk in microbatches(groups, cfg.batch.tokens_per_microbatch, microbatch_budget(model, cfg)):
        with autocast_for(device, cfg.autocast_bf16):
            logps, _ = group_logprobs(model, chunk, device)
        losses = []
        for g, logp in zip(chunk, logps):
            loss, stats = sft_loss(logp, g.loss_mask.to(device), normaliser)
            losses.append(loss)
            nll_sum += stats["nll"] * g.num_tokens
        loss = torch.stack(losses).sum()
        loss.backward()
        total += float(loss.detach())
    grad_norm = apply_gradients(model, optimizer, cfg.optim.grad_clip)
    return StepResult(loss=total, grad_norm=grad_norm, tokens=int(normaliser), stats={"nll": nll_sum / normaliser})


class Sft:
    """The trainer loop's learner for trainer.algorithm = "sft": what it selects, the samples it builds from the
    kept sessions, and its `batch.epochs` × `batch.minibatches` optimizer steps over them."""

    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self.selectors: list[Selector] = []
        if cfg.overlong:
            self.selectors.append(ShapeOverlong(cfg.overlong, cfg.batch.style))
        self.selectors.append(KeepAccepted(cfg.sft.min_reward, cfg.sft.per_group, cfg.sft.distinct))

    def samples(self, sessions: list[SessionSamples]) -> list[Sample]:
        return [x for per_session in response_samples(sessions, self.cfg.batch.style) for x in per_session]

    def train(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer,
        samples: list[Sample],
        device: torch.device,
        reference: Reference | None,
        pad_id: int,
    ) -> StepResult | None:
        b = self.cfg.batch
        groups = pack(samples, b.tokens_per_microbatch, pad_id)
        parts = [groups[i :: b.minibatches] for i in range(b.minibatches)]
        result = None
        for _ in range(b.epochs):
            for part in (p for p in parts if p):
                result = sft_step(model, optimizer, part, self.cfg, device)
        return result
