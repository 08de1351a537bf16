"""The critic of PPO with a value function: a value head, its values over a batch, GAE targets, its update.

The value head is one linear layer from a decoder's last hidden state to a scalar, V_t read at the
position that predicts token t (the state before t is sampled, where the policy's logprob is read too).
Its decoder is the policy's own (`body=None`: here the hidden states are detached, so `critic_step` trains
the head alone and leaves the policy untouched; with `[trainer.critic] value_coef` the policy's
`train_step` adds the value loss to its own instead, and `step_head` steps the head) or a separate model
trained with it. Before the PPO
passes, `estimate_values` stores V_old on each group; `assign_gae` turns those into per-token advantages
and value targets over the batch's conversation trees (`trainer/gae.py`, individual samples: each row is
one completion, linked to its parent by id); `critic_step` then takes one optimizer step on the clipped
value loss (`trainer/losses.value_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.batch import PrefixGroup
from trainer.config import CriticConfig
from trainer.gae import Turn, tree_gae, whiten
from trainer.losses import loss_denominator, value_loss
from trainer.step import group_hidden, microbatches, scatter_rows


class ValueHead(torch.nn.Module):
    """hidden (N, H) -> V (N,), float32; zero-initialised, so every value starts at 0."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


@dataclass
class Critic:
    head: ValueHead
    optimizer: torch.optim.Optimizer  # over the head's parameters, and the body's when it has its own
    body: Any = None  # a separate Hugging Face causal LM; None: the policy's decoder, detached

    def parameters(self) -> list[torch.nn.Parameter]:
        own = list(self.head.parameters())
        return own + ([p for p in self.body.parameters() if p.requires_grad] if self.body is not None else [])


CRITIC_FILE = "critic.pt"
"""A checkpoint's value head and the critic's optimizer state."""
CRITIC_MODEL_DIR = "critic_model"
"""A checkpoint's separate critic model (save_pretrained), when `[trainer.critic] model` is set."""


def build(ccfg: CriticConfig, policy_model: Any, device: torch.device, resume: Path | None = None) -> Critic:
    """The critic of `[trainer.critic]`: a head on the policy's decoder, or `ccfg.model` with its own head;
    from checkpoint `resume` when it holds one (its head, optimizer state and separate model), else new
    (a run that turns the critic on when it resumes starts it from zero values)."""
    if resume is not None and not (resume / CRITIC_FILE).is_file():
        resume = None
    body = None
    if ccfg.model:
        from transformers import AutoModelForCausalLM

        source = resume / CRITIC_MODEL_DIR if resume is not None else ccfg.model
        body = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(device).eval()
    hidden_size = (body if body is not None else policy_model).config.hidden_size
    head = ValueHead(hidden_size).to(device)
    params = list(head.parameters()) + (list(body.parameters()) if body is not None else [])
    critic = Critic(head, torch.optim.AdamW(params, lr=ccfg.lr, weight_decay=0.0), body)
    if resume is not None:
        state = torch.load(resume / CRITIC_FILE, map_location=device, weights_only=True)
        critic.head.load_state_dict(state["head"])
        critic.optimizer.load_state_dict(state["optimizer"])
    return critic


def save(critic: Critic, target: Path) -> None:
    """Write the critic into checkpoint folder `target` (read back by `build(..., resume=target)`)."""
    target.mkdir(parents=True, exist_ok=True)
    torch.save({"head": critic.head.state_dict(), "optimizer": critic.optimizer.state_dict()}, target / CRITIC_FILE)
    if critic.body is not None:
        critic.body.save_pretrained(target / CRITIC_MODEL_DIR, safe_serialization=True)


def prepare(
    critic: Critic,
    policy_model: Any,
    groups: list[PrefixGroup],
    ccfg: CriticConfig,
    device: torch.device,
    tokens_per_microbatch: int,
    agg: str = "mean",
) -> None:
    """Before a step's PPO passes: the critic's values on every group, then GAE advantages and value targets."""
    estimate_values(critic, policy_model, groups, device, tokens_per_microbatch)
    assign_gae(groups, ccfg.gamma, ccfg.lam, agg, ccfg.whiten)


def group_values(
    critic: Critic, policy_model: Any, groups: list[PrefixGroup], device: torch.device
) -> list[torch.Tensor]:
    """V_t (G, O) for every continuation position of each group, zero off the loss mask."""
    body = critic.body if critic.body is not None else policy_model
    if critic.body is None:
        with torch.no_grad():
            hidden, _, sel, _ = group_hidden(body, groups, device)
    else:
        hidden, _, sel, _ = group_hidden(body, groups, device)
    return scatter_rows(sel, critic.head(hidden[sel]), groups)


def estimate_values(
    critic: Critic, policy_model: Any, groups: list[PrefixGroup], device: torch.device, tokens_per_microbatch: int
) -> None:
    """Store the critic's current values on each group as `old_values` (no gradient)."""
    for module in (critic.head, critic.body if critic.body is not None else policy_model):
        module.eval()
    with torch.no_grad():
        for chunk in microbatches(groups, tokens_per_microbatch):
            for group, values in zip(chunk, group_values(critic, policy_model, chunk, device)):
                group.old_values = values.cpu()


def assign_gae(groups: list[PrefixGroup], gamma: float, lam: float, agg: str = "mean", whitened: bool = True) -> None:
    """Replace each group's advantages by GAE over the batch's trees, and set its value targets A + V_old.

    Rows are completions (`Sample.turn`); a parent outside the batch makes its child a root. With
    `whitened`, the advantages (not the targets) are whitened over every trained token of the batch."""
    turns: dict[str, Turn] = {}
    for g in groups:
        if g.old_values is None or g.turns is None or any(t is None for t in g.turns):
            raise ValueError("GAE needs each group's old_values (estimate_values) and individual samples' turns")
        for row, (turn_id, parent_id, reward) in enumerate(g.turns):
            turns[turn_id] = Turn(parent_id, reward, g.old_values[row][g.loss_mask[row]].tolist())
    gae = tree_gae(turns, gamma, lam, agg)
    for g in groups:
        adv, targets = torch.zeros_like(g.old_values), torch.zeros_like(g.old_values)
        for row, (turn_id, _, _) in enumerate(g.turns):
            adv[row][g.loss_mask[row]] = torch.tensor(gae[turn_id].advantages)
            targets[row][g.loss_mask[row]] = torch.tensor(gae[turn_id].returns)
        g.advantages, g.value_targets = adv, targets
    if whitened:
        flat = torch.cat([g.advantages[g.loss_mask] for g in groups])
        white = whiten(flat, torch.ones_like(flat, dtype=torch.bool))
        for g, part in zip(groups, white.split([int(g.loss_mask.sum()) for g in groups])):
            g.advantages = torch.zeros_like(g.advantages).masked_scatter(g.loss_mask, part)


def step_head(critic: Critic, grad_clip: float = 0.0) -> dict[str, float]:
    """Step the critic's optimizer on the head's gradients from a joint `train_step` (value_coef > 0)."""
    params = [p for p in critic.head.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf")))
    critic.optimizer.step()
    critic.optimizer.zero_grad(set_to_none=True)
    return {"value_grad_norm": grad_norm}


def critic_step(
    critic: Critic,
    policy_model: Any,
    batches: list[PrefixGroup],
    device: torch.device,
    *,
    value_clip: float,
    tokens_per_microbatch: int,
    grad_clip: float = 0.0,
) -> dict[str, float]:
    """One optimizer step of the critic on the clipped value loss over `batches` (token mean over the batch)."""
    for module in (critic.head, critic.body):
        if module is not None:
            module.train()
    critic.optimizer.zero_grad(set_to_none=True)
    normaliser = sum(loss_denominator(mb.loss_mask, "token_mean") for mb in batches)
    sums: dict[str, float] = {}
    tokens = 0
    for chunk in microbatches(batches, tokens_per_microbatch):
        values = group_values(critic, policy_model, chunk, device)
        losses = []
        for mb, v in zip(chunk, values):
            if mb.old_values is None or mb.value_targets is None:
                raise ValueError("critic_step needs old_values and value_targets: run estimate_values and assign_gae")
            loss, stats = value_loss(
                v,
                mb.old_values.to(device),
                mb.value_targets.to(device),
                mb.loss_mask.to(device),
                value_clip=value_clip,
                normaliser=normaliser,
            )
            losses.append(loss)
            n = mb.num_tokens
            tokens += n
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value * n
        torch.stack(losses).sum().backward()
    params = [p for p in critic.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf")))
    critic.optimizer.step()
    for module in (critic.head, critic.body):
        if module is not None:
            module.eval()
    return {**{k: v / max(tokens, 1) for k, v in sums.items()}, "value_grad_norm": grad_norm}
