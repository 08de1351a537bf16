"""On-policy distillation: the student learns the teacher's distribution on the student's own samples.

With `trainer.algorithm = "distill"` every claimed session is trained (rewards are not needed; those
of a runner's reward function are ignored) and each sampled token's advantage is the per-token
reverse-KL reward

    A_t = log π_teacher(y_t | y_<t) − log π_behaviour(y_t | y_<t)

with no discounting across tokens (whitened over the step's sampled tokens with `distill.whiten`, the
default): the negative of the sampled estimate of KL(π_student ‖ π_teacher) at that token, the
student's own sampling policy standing in for the student (Agarwal et al. 2024, GKD, arXiv
2306.13649; Gu et al. 2024, MiniLLM, arXiv 2306.08543). The step is the trainer's decoupled PPO step
on those advantages (clipping and the behaviour weight as configured), so staleness is handled as
for RL. `distill.reward_coef` > 0 adds that many times the session's return, for distillation beside
a task reward.

The teacher is a local model (a Hugging Face id, a path, or a checkpoint of an earlier run: its
`model` folder), loaded frozen on the trainer's device; it must share the student's tokenizer.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from proxy.store.samples import SessionSamples
from trainer.batch import PrefixGroup, Sample, build_samples
from trainer.config import TrainerConfig
from trainer.selection import Selection, Selector
from trainer.step import autocast_for, group_logprobs, microbatches


def token_rewards(teacher: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(G, O) advantages: teacher − behaviour logprob on sampled tokens, 0 elsewhere."""
    return torch.where(mask, teacher - behaviour, torch.zeros_like(teacher))


class KeepAll:
    """Every claimed session is trained: distillation needs no reward signal to compare."""

    def apply(self, claim: Selection) -> None:
        for s in claim.sessions:
            claim.baseline[s.session_id] = 0.0
            claim.scale[s.session_id] = 1.0
        claim.flat = []


def load_teacher(name: str, device: torch.device, cache_dir: str = "") -> Any:
    from transformers import AutoModelForCausalLM

    from proxy.runtime.model_files import resolve_model

    path = Path(name)
    if (path / "model").is_dir():  # a trainer checkpoint: its model folder
        path = path / "model"
    source = str(path) if path.exists() else str(resolve_model(name, cache_dir))
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(device)
    model.eval()
    model.requires_grad_(False)
    return model


class Distill:
    """What trainer.algorithm = "distill" changes in the trainer loop: its selector, its samples (no group
    advantages), and the teacher's token rewards added to the packed groups before PPO's passes
    (`Trainer._passes`, whose step, proximal recomputation and minibatches are the same as for RL)."""

    def __init__(self, cfg: TrainerConfig, teacher: Any = None) -> None:
        self.cfg = cfg
        self.selectors: list[Selector] = [KeepAll()]
        self.teacher = teacher  # loaded on the first step (the trainer's device is known then)

    def samples(self, sessions: list[SessionSamples]) -> list[Sample]:
        zero = {s.session_id: 0.0 for s in sessions}
        built = build_samples(sessions, self.cfg.batch.style, zero, {sid: 1.0 for sid in zero})
        coef = self.cfg.distill.reward_coef
        return [replace(x, advantages=[a * coef for a in x.advantages]) for x in built]

    def teach(self, groups: list[PrefixGroup], device: torch.device) -> dict[str, float]:
        """Add the reverse-KL token rewards to each group's advantages (whitened over the step's sampled
        tokens with `distill.whiten`); the mean sampled KL estimate."""
        if self.teacher is None:
            self.teacher = load_teacher(self.cfg.distill.teacher, device)
        rewards, order = [], []
        with torch.no_grad(), autocast_for(device, self.cfg.autocast_bf16):
            for chunk in microbatches(groups, self.cfg.batch.tokens_per_microbatch):
                for group, teacher_lp in zip(chunk, group_logprobs(self.teacher, chunk, device)[0], strict=True):
                    behaviour = group.behav_logprobs.float()
                    rewards.append(token_rewards(teacher_lp.cpu().float(), behaviour, group.loss_mask))
                    order.append(group)
        sampled = torch.cat([r[g.loss_mask] for r, g in zip(rewards, order, strict=True)])
        mean = float(sampled.mean()) if sampled.numel() else 0.0
        std = float(sampled.std()) if sampled.numel() > 1 else 1.0
        for reward, group in zip(rewards, order, strict=True):
            if self.cfg.distill.whiten:
                reward = torch.where(group.loss_mask, (reward - mean) / (std + 1e-6), torch.zeros_like(reward))
            group.advantages = group.advantages + reward.to(group.advantages.dtype)
        return {"distill_kl": -mean, "distill_reward_std": std}
