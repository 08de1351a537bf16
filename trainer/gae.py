"""Generalized advantage estimation over a session's conversation tree (Schulman et al. 2016, arXiv 1506.02438).

A turn is one completion: its sampled tokens t = 0..n-1, the critic's value V_t of the state before token t
is sampled, and its raw reward R, received with its last token. Per token within a turn:

  δ_t = r_t + γ·V_{t+1} − V_t        r_t = R at t = n − 1, else 0
  A_t = δ_t + γλ·A_{t+1}

After a turn's last token the episode goes on in its children (the next turns, past a tool or user message
the policy did not sample), so V_n = agg_c V_c[0] and A_n = agg_c A_c[0] over the children's first tokens,
aggregated as `rewards/returns.py` aggregates returns (mean; or max: the child of largest V_c[0] + A_c[0]),
and a leaf has V_n = A_n = 0. The value target is R_t = A_t + V_t. With λ = 1, A_t = G_t − V_t, G_t the
return Σ_k γ^k r_{t+k} along the tree (children averaged); with λ = 0, A_t = δ_t, the one-step TD error.
γ and λ act per token, as in PPO for language models (Ouyang et al. 2022): γ < 1 discounts a long reply hard.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rewards.returns import children_first


@dataclass(frozen=True)
class Turn:
    parent_id: str | None
    reward: float  # raw reward of the completion, received with its last token
    values: list[float]  # (n,) V_t for each sampled token


@dataclass(frozen=True)
class TurnGAE:
    advantages: list[float]  # (n,) A_t
    returns: list[float]  # (n,) A_t + V_t, the value target


def _entry(turn: Turn, gae: TurnGAE, boot_v: float, boot_a: float) -> tuple[float, float]:
    """(V, A) a parent bootstraps from: the turn's first token's; a turn without sampled tokens passes its
    children's through, its reward added to the value (so the parent's last δ still sees it)."""
    if turn.values:
        return turn.values[0], gae.advantages[0]
    return turn.reward + boot_v, boot_a


def _pool(entries: list[tuple[float, float]], agg: str) -> tuple[float, float]:
    if not entries:
        return 0.0, 0.0
    if agg == "max":
        return max(entries, key=lambda e: e[0] + e[1])
    return sum(v for v, _ in entries) / len(entries), sum(a for _, a in entries) / len(entries)


def _turn_gae(turn: Turn, boot_v: float, boot_a: float, gamma: float, lam: float) -> TurnGAE:
    n = len(turn.values)
    advantages = [0.0] * n
    next_v, next_a = boot_v, boot_a
    for t in range(n - 1, -1, -1):
        r = turn.reward if t == n - 1 else 0.0
        delta = r + gamma * next_v - turn.values[t]
        next_a = advantages[t] = delta + gamma * lam * next_a
        next_v = turn.values[t]
    return TurnGAE(advantages, [a + v for a, v in zip(advantages, turn.values)])


def tree_gae(turns: dict[str, Turn], gamma: float, lam: float, agg: str = "mean") -> dict[str, TurnGAE]:
    """Per-token advantages and value targets of every turn of a tree; parents outside `turns` are roots."""
    if agg not in ("mean", "max"):
        raise ValueError(f"aggregate must be 'mean' or 'max', not {agg!r}")
    order, children = children_first({turn_id: turn.parent_id for turn_id, turn in turns.items()})
    out: dict[str, TurnGAE] = {}
    entries: dict[str, tuple[float, float]] = {}
    for turn_id in order:
        boot_v, boot_a = _pool([entries[k] for k in children[turn_id]], agg)
        turn = turns[turn_id]
        out[turn_id] = _turn_gae(turn, boot_v, boot_a, gamma, lam)
        entries[turn_id] = _entry(turn, out[turn_id], boot_v, boot_a)
    return out


def whiten(advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(A − mean) / (std + eps) over the masked entries of a batch (N, T), std with n − 1; 0 off the mask."""
    m = mask.bool()
    live = advantages[m]
    if live.numel() < 2:
        return torch.where(m, advantages, 0.0)
    return torch.where(m, (advantages - live.mean()) / (live.std() + eps), 0.0)
