"""Group-relative advantage estimators on per-sample scalar rewards.

Samples of one task share a group id (groups may differ in size). Every estimator is
A_i = (r_i - b_i) / s_i, with baseline b_i and scale s_i taken from the rewards of i's group g:

  grpo          b = mean_g r                    s = std_g r + eps           Shao et al. 2024 (DeepSeekMath)
  drgrpo        b = mean_g r                    s = 1                       Liu et al. 2025 (Dr. GRPO)
  rloo          b = mean_{j in g, j != i} r_j   s = 1                       Ahmadian et al. 2024 (RLOO)
  reinforce_pp  b = mean_g r                    s = std_batch(r - b) + eps  Hu 2025 (REINFORCE++-baseline)

std is the sample standard deviation (n - 1, as torch.std; DeepSeekMath §4.1.2 writes std(r)). The
REINFORCE++ std is global: over the group-centred rewards of every sample in the batch whose group
carries signal. A group whose rewards are all equal, a group of one included, carries none: its samples
get advantage 0 and are flagged `skipped` so the trainer can drop and count them (DAPO dynamic sampling).
arXiv: DeepSeekMath 2402.03300, Dr. GRPO 2503.20783, RLOO 2402.14740, REINFORCE++ 2501.03262.

`max_variance_subset` picks which samples of a group to train when only m may be (PODS, Xu et al.
2025, arXiv 2504.13818): the m whose rewards vary most, which are always some of the lowest and
the rest of the highest.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Advantages:
    values: torch.Tensor  # (N,) per sample, or (N, T) per token from `token_level`
    skipped: torch.Tensor  # (N,) bool: the sample's group has zero reward variance
    baseline: torch.Tensor  # (N,) b_i
    scale: torch.Tensor  # (N,) s_i

    @property
    def num_skipped(self) -> int:
        return int(self.skipped.sum())


@dataclass(frozen=True)
class _Groups:
    index: torch.Tensor  # (N,) long: the sample's group, 0..G-1
    count: torch.Tensor  # (N,) float: size of the sample's group
    mean: torch.Tensor  # (N,) mean reward of the sample's group
    flat: torch.Tensor  # (N,) bool: every reward of the sample's group is equal

    def total(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x (N,) over each sample's group, broadcast back to (N,)."""
        num_groups = int(self.index.max()) + 1 if self.index.numel() else 0
        return x.new_zeros(num_groups).index_add_(0, self.index, x)[self.index]


def _groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> _Groups:
    _, index = torch.unique(group_ids, return_inverse=True)
    num_groups = int(index.max()) + 1 if index.numel() else 0
    count = torch.bincount(index, minlength=num_groups).to(rewards.dtype)
    total = rewards.new_zeros(num_groups).index_add_(0, index, rewards)
    # Exact comparison, not std < tol: [0.1, 0.1, 0.1] must be flat although its float mean is not 0.1.
    hi = rewards.new_zeros(num_groups).scatter_reduce_(0, index, rewards, "amax", include_self=False)
    lo = rewards.new_zeros(num_groups).scatter_reduce_(0, index, rewards, "amin", include_self=False)
    return _Groups(index, count[index], (total / count)[index], (hi == lo)[index])


def _advantages(
    rewards: torch.Tensor, baseline: torch.Tensor, scale: torch.Tensor, skipped: torch.Tensor
) -> Advantages:
    values = torch.where(skipped, torch.zeros_like(rewards), (rewards - baseline) / scale)
    return Advantages(values, skipped, baseline, scale)


def grpo(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> Advantages:
    """(r - mean_g) / (std_g + eps), std with n - 1. rewards (N,) float, group_ids (N,) long."""
    g = _groups(rewards, group_ids)
    var = g.total((rewards - g.mean) ** 2) / (g.count - 1).clamp(min=1)
    return _advantages(rewards, g.mean, var.sqrt() + eps, g.flat)


def drgrpo(rewards: torch.Tensor, group_ids: torch.Tensor) -> Advantages:
    """r - mean_g: Dr. GRPO drops the std, whose division favours easy and hard prompts."""
    g = _groups(rewards, group_ids)
    return _advantages(rewards, g.mean, torch.ones_like(rewards), g.flat)


def rloo(rewards: torch.Tensor, group_ids: torch.Tensor) -> Advantages:
    """r_i - mean_{j != i} r_j, the leave-one-out baseline; groups of one are skipped."""
    g = _groups(rewards, group_ids)
    others = (g.total(rewards) - rewards) / (g.count - 1).clamp(min=1)
    return _advantages(rewards, others, torch.ones_like(rewards), g.flat)


def reinforce_pp(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> Advantages:
    """(r - mean_g) / (std_batch + eps): group baseline, then global whitening over the batch.

    The batch std runs over the centred rewards of the non-skipped samples (zero-variance groups would
    only shrink it). Their batch mean is already 0, each group's centred rewards summing to 0, so the
    whitening's mean subtraction is a no-op here.
    """
    g = _groups(rewards, group_ids)
    centred = rewards - g.mean
    live = centred[~g.flat]
    std = live.std() if live.numel() >= 2 else rewards.new_tensor(1.0)
    return _advantages(rewards, g.mean, (std + eps).expand_as(rewards), g.flat)


def max_variance_subset(rewards: list[float], m: int) -> list[int]:
    """Indices (ascending) of the m of `rewards` whose population variance is largest: the i
    lowest and the m - i highest for the best i (PODS, Lemma 3.1), ties broken towards the lowest
    i, and among equal rewards towards the earliest. All of them when there are at most m."""
    if len(rewards) <= m:
        return list(range(len(rewards)))
    order = sorted(range(len(rewards)), key=lambda i: rewards[i])  # stable: earliest first among equals
    ascending = [rewards[i] for i in order]
    best, best_var = 0, -1.0
    for low in range(m + 1):
        picked = ascending[:low] + ascending[len(ascending) - (m - low) :]
        mean = sum(picked) / m
        var = sum((r - mean) ** 2 for r in picked) / m
        if var > best_var + 1e-12:
            best, best_var = low, var
    top = sorted(order[best:], key=lambda i: (-rewards[i], i))[: m - best]  # highest, earliest among equals
    return sorted(order[:best] + top)


Estimator = Callable[[torch.Tensor, torch.Tensor], Advantages]

ADVANTAGES: dict[str, Estimator] = {
    "grpo": grpo,
    "drgrpo": drgrpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
}

# False: the loss must not divide a sequence's token sum by its own length (no loss_agg="seq_mean");
# use loss_agg="token_sum_norm", Dr. GRPO's constant normaliser (num sequences x max generation length).
LENGTH_NORMALISED: dict[str, bool] = {"grpo": True, "drgrpo": False, "rloo": True, "reinforce_pp": True}


def token_advantages(seq_adv: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast per-sample advantages (N,) onto their loss tokens (N, T); 0 elsewhere."""
    return torch.where(loss_mask.bool(), seq_adv[:, None], torch.zeros_like(seq_adv)[:, None])


def token_level(
    returns_tokens: torch.Tensor,  # (N, T) per-token returns, e.g. a session's tree-discounted returns
    seq_rewards: torch.Tensor,  # (N,) each sample's scalar (final) reward
    group_ids: torch.Tensor,  # (N,) long
    estimator: Estimator,
    loss_mask: torch.Tensor,  # (N, T)
) -> Advantages:
    """(returns_t - b_i) / s_i on loss tokens, with b and s computed by `estimator` from seq_rewards.

    Per-token returns are normalised with the group statistics of the scalar rewards, so a sample
    whose returns all equal its reward gets exactly `token_advantages(estimator(...).values)`. Samples
    of zero-variance groups get 0 everywhere. The result's `values` is (N, T).
    """
    seq = estimator(seq_rewards, group_ids)
    values = (returns_tokens - seq.baseline[:, None]) / seq.scale[:, None]
    values = torch.where(loss_mask.bool() & ~seq.skipped[:, None], values, torch.zeros_like(values))
    return Advantages(values, seq.skipped, seq.baseline, seq.scale)
