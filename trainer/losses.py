"""Decoupled PPO policy loss (AReaL, Fu et al. 2025, arXiv 2505.24298).

Tokens were sampled by a behaviour policy π_behav (the engine, possibly some versions stale). The
decoupled objective separates the off-policy correction from the trust region:

  loss_t = -w_t · min(u_t · A_t, clip(u_t, 1 - eps_clip, 1 + eps_clip_high) · A_t)
  u_t = π_θ / π_prox = exp(logp_t - prox_logp_t)           gradient flows through logp only
  w_t = π_prox / π_behav = exp(prox_logp_t - behav_logp_t)  detached; outside [behav_floor, behav_cap] masked or clamped

The asymmetric clip is DAPO's clip-higher (Yu et al. 2025). ratio_level="sequence" replaces u_t and w_t by
GSPO's length-normalised sequence ratios (Zheng et al. 2025, arXiv 2507.18071). An optional k3 KL
penalty to a reference model, exp(ref - logp) - (ref - logp) - 1 (Schulman 2020), is added per token,
and an optional entropy bonus, -entropy_coef · H_t (H_t: entropy of the current policy at token t,
at the sampling temperature), keeps exploration from collapsing onto one reply per prompt.
The proximal policy is recomputed, or approximated by log-linear interpolation over policy versions
(A-3PO, Li et al. 2025).

Two masks drop a token's policy-gradient term (its weight becomes 0; it still counts in the denominator):
- IcePop's two-sided mask (Ling team 2025, "Small Leak Can Sink a Great Ship"): w_t outside
  [behav_floor, behav_cap], a token the training and the sampling policy disagree on in either direction.
- M2PO's second-moment trust region (Zheng et al. 2025, arXiv 2510.01161): of a pass's tokens, those of
  largest M2_t = (log w_t)² are masked, largest first, until the mean M2 of the rest is at most τ
  (`second_moment_keep`); unlike a clip it removes only the few extreme tokens of stale samples.

With a critic (`trainer/gae.py`), `value_loss` is PPO's clipped value loss (Schulman et al. 2017, as in
OpenAI baselines' ppo2): 0.5 · max((V − R)², (clip(V, V_old − ε_v, V_old + ε_v) − R)²).

Learning from the same store without advantages (`trainer/preference.py`, `trainer/sft.py`):
- `dpo_loss`, DPO (Rafailov et al. 2023, arXiv 2305.18290, eq. 7) over pairs of responses to one prompt, each
  response's logprobs summed over its tokens: −log σ(β · ((log π(y_c) − log π_ref(y_c)) − (log π(y_r) −
  log π_ref(y_r)))). Without a reference the π_ref terms are dropped; with lengths each log-ratio is divided by
  its response's token count, and a target margin γ is subtracted inside σ (SimPO, Meng et al. 2024,
  arXiv 2405.14734, eq. 6, when also reference-free).
- `sft_loss`, the mean negative log-likelihood of the trained tokens (rejection-sampling fine-tuning).
"""

import torch

LOSS_AGGS = ("token_mean", "seq_mean", "token_sum_norm")


def _seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x (B, T) over each row's masked tokens -> (B,); 0 for a row without any."""
    return torch.where(mask, x, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1))


def loss_denominator(loss_mask: torch.Tensor, loss_agg: str) -> float:
    """Divisor `aggregate` uses by default; summed over microbatches it is the full batch's normaliser.

    token_mean: masked tokens. seq_mean: sequences with at least one masked token. token_sum_norm:
    B · T, Dr. GRPO's constant; across microbatches of different padded lengths pass
    num_sequences · max_new_tokens instead.
    """
    mask = loss_mask.bool()  # (B, T)
    if loss_agg == "token_mean":
        return float(mask.sum())
    if loss_agg == "seq_mean":
        return float(mask.any(-1).sum())
    if loss_agg == "token_sum_norm":
        return float(mask.shape[0] * mask.shape[1])
    raise ValueError(f"loss_agg {loss_agg!r} must be one of {LOSS_AGGS}")


def aggregate(
    token_loss: torch.Tensor,  # (B, T)
    loss_mask: torch.Tensor,  # (B, T)
    loss_agg: str,
    normaliser: float | None = None,
) -> torch.Tensor:
    """Scalar loss: token_mean and token_sum_norm sum the masked token losses, seq_mean sums each
    sequence's token mean; the sum is divided by `normaliser`, or by `loss_denominator` when None."""
    mask = loss_mask.bool()
    denominator = loss_denominator(mask, loss_agg) if normaliser is None else normaliser
    if loss_agg == "seq_mean":
        total = _seq_mean(token_loss, mask).sum()
    else:
        total = torch.where(mask, token_loss, 0.0).sum()
    if normaliser is None and denominator == 0:
        return total  # nothing to train on: an exact 0 that still carries a (zero) gradient
    return total / denominator


def proximal_logprobs_interpolate(
    behav_logp: torch.Tensor,  # (B, T) logprobs of the policy that sampled each token
    current_logp: torch.Tensor,  # (B, T) logprobs of the trainer's policy, version current_version
    token_versions: torch.Tensor,  # (B, T) long: version v_b that sampled each token
    current_version: int,
    proximal_version: int,
) -> torch.Tensor:
    """Approximate proximal logprobs (B, T), detached, by interpolating in log space over versions:

    prox = behav + alpha · (current - behav),  alpha = clip((v_p - v_b) / (v_c - v_b), 0, 1)

    with v_c = current_version and v_p = proximal_version (AReaL: v_c - 1, the policy before this
    update). A token sampled by the current version itself (v_c == v_b) takes the current logprob.
    """
    behav, current = behav_logp.detach(), current_logp.detach()
    v_b = token_versions.to(behav.dtype)
    span = current_version - v_b
    alpha = ((proximal_version - v_b) / torch.where(span == 0, 1.0, span)).clamp(0.0, 1.0)
    return torch.where(span == 0, current, behav + alpha * (current - behav))


def second_moment_keep(log_w: torch.Tensor, tau: float) -> torch.Tensor:
    """M2PO's mask over N trained tokens: log_w (N,) = log π_prox/π_behav -> (N,) bool, True = kept.

    M2_t = log_w_t². While the mean M2 of the kept tokens exceeds tau, the kept token of largest M2 is
    masked (earliest first among equals); if even the smallest M2 exceeds tau, every token is masked.
    """
    m2 = log_w.detach().cpu().double() ** 2  # float64 on the CPU: exact running means on any device
    n = m2.numel()
    order = torch.sort(m2, descending=True, stable=True).indices
    # Mean M2 of the kept tokens after masking the k largest: tail sums over the sorted values.
    tail = m2[order].flip(0).cumsum(0).flip(0)  # tail[k] = sum of sorted[k:]
    kept_mean = tail / torch.arange(n, 0, -1, dtype=m2.dtype)
    fits = (kept_mean <= tau).nonzero()
    k = int(fits[0]) if fits.numel() else n  # the fewest largest tokens to mask
    keep = torch.ones(n, dtype=torch.bool)
    keep[order[:k]] = False
    return keep.to(log_w.device)


def policy_loss(
    logp: torch.Tensor,  # (B, T) current policy, carries the gradient
    prox_logp: torch.Tensor,  # (B, T) proximal policy
    behav_logp: torch.Tensor,  # (B, T) behaviour policy (engine)
    advantages: torch.Tensor,  # (B, T) per token
    loss_mask: torch.Tensor,  # (B, T) 1 on trained tokens
    *,
    eps_clip: float,
    eps_clip_high: float,
    behav_cap: float,
    behav_cap_mode: str,
    ratio_level: str,
    loss_agg: str,
    behav_floor: float = 0.0,
    keep: torch.Tensor | None = None,  # (B, T) bool: tokens M2PO's trust region keeps
    ref_logp: torch.Tensor | None = None,  # (B, T) reference policy
    kl_coef: float = 0.0,
    normaliser: float | None = None,
    entropy: torch.Tensor | None = None,  # (B, T) current policy's entropy per token
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO loss (scalar) and stats; see the module docstring.

    Tokens masked by the behaviour cap or floor, or left out of `keep`, contribute no policy-gradient term
    (the KL penalty and entropy bonus still apply to them) but still count in the denominator, so the
    normaliser of a microbatch is known before the forward pass. ratio_level="sequence" uses the
    GSPO-token form: u_t has the value of the sequence ratio exp(mean_t(logp - prox)) and the gradient
    u_t · ∇logp_t, which with loss_agg="seq_mean" and one advantage per sequence is GSPO's gradient.
    """
    mask = loss_mask.bool()
    prox, behav = prox_logp.detach(), behav_logp.detach()
    # where() before exp(): padding may hold any logprob, and exp(inf) * 0 would poison sums and grads.
    log_u = torch.where(mask, logp - prox, 0.0)
    log_w = torch.where(mask, prox - behav, 0.0)
    m2 = log_w**2  # M2PO's second moment, per token whatever the ratio level
    if ratio_level == "sequence":
        log_u = _seq_mean(log_u.detach(), mask)[:, None] + log_u - log_u.detach()
        log_w = _seq_mean(log_w, mask)[:, None].expand_as(log_w)
    elif ratio_level != "token":
        raise ValueError(f"ratio_level {ratio_level!r} must be 'token' or 'sequence'")
    ratio, weight = log_u.exp(), log_w.exp()

    capped = mask & (weight > behav_cap) if behav_cap > 0 else torch.zeros_like(mask)
    floored = mask & (weight < behav_floor) if behav_floor > 0 else torch.zeros_like(mask)
    if behav_cap_mode == "mask":
        capped_weight = torch.where(capped | floored, 0.0, weight)
    elif behav_cap_mode == "clamp":
        capped_weight = torch.where(capped, behav_cap, torch.where(floored, behav_floor, weight))
    else:
        raise ValueError(f"behav_cap_mode {behav_cap_mode!r} must be 'mask' or 'clamp'")
    if keep is not None:
        capped_weight = torch.where(keep.bool(), capped_weight, 0.0)

    clipped = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    token_loss = -capped_weight * torch.minimum(ratio * advantages, clipped * advantages)
    kl = torch.zeros_like(token_loss)
    if ref_logp is not None:
        d = torch.where(mask, ref_logp.detach() - logp, 0.0)
        kl = d.exp() - d - 1.0
        token_loss = token_loss + kl_coef * kl
    if entropy is not None and entropy_coef:
        token_loss = token_loss - entropy_coef * torch.where(mask, entropy, 0.0)

    loss = aggregate(token_loss, mask, loss_agg, normaliser)
    ratio = ratio.detach()
    stats = {
        "clip_frac_low": _masked_mean(((advantages < 0) & (ratio < 1.0 - eps_clip)).float(), mask),
        "clip_frac_high": _masked_mean(((advantages > 0) & (ratio > 1.0 + eps_clip_high)).float(), mask),
        "behav_capped_frac": _masked_mean(capped.float(), mask),
        "ratio_mean": _masked_mean(ratio, mask),
        "behav_weight_mean": _masked_mean(weight, mask),  # before the cap
        "kl": _masked_mean(kl.detach(), mask),
        "m2": _masked_mean(m2, mask),  # before any mask
    }
    if behav_floor > 0:
        stats["behav_floored_frac"] = _masked_mean(floored.float(), mask)
    if keep is not None:
        stats["m2po_masked_frac"] = _masked_mean((~keep.bool()).float(), mask)
    if entropy is not None:
        stats["entropy"] = _masked_mean(entropy.detach(), mask)
    return loss, stats


def value_loss(
    values: torch.Tensor,  # (B, T) current critic, carries the gradient
    old_values: torch.Tensor,  # (B, T) the critic's values the advantages were estimated with
    returns: torch.Tensor,  # (B, T) value targets A + V_old
    loss_mask: torch.Tensor,  # (B, T) 1 on trained tokens
    *,
    value_clip: float,
    loss_agg: str = "token_mean",
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (scalar), aggregated as the policy loss, and stats; value_clip <= 0 leaves V unclipped.

    The max keeps the larger error, so a value that moved more than ε_v from V_old towards R gets no
    gradient from the clipped branch's side: the critic cannot jump further in one update."""
    mask = loss_mask.bool()
    old, target = old_values.detach(), returns.detach()
    err = (values - target) ** 2
    if value_clip > 0:
        clipped = old + (values - old).clamp(-value_clip, value_clip)
        err_clipped = (clipped - target) ** 2
        token_loss = 0.5 * torch.maximum(err, err_clipped)
        clip_frac = _masked_mean((err_clipped > err).float(), mask)
    else:
        token_loss = 0.5 * err
        clip_frac = 0.0
    loss = aggregate(torch.where(mask, token_loss, 0.0), mask, loss_agg, normaliser)
    stats = {
        "value_loss": _masked_mean(token_loss.detach(), mask),
        "value_clip_frac": clip_frac,
        "value_mean": _masked_mean(values.detach(), mask),
        "return_mean": _masked_mean(target, mask),
    }
    return loss, stats


def dpo_loss(
    chosen_logp: torch.Tensor,  # (P,) log π(y_c): each chosen response's logprobs summed, carries the gradient
    rejected_logp: torch.Tensor,  # (P,) log π(y_r)
    chosen_ref: torch.Tensor | None,  # (P,) log π_ref(y_c); None: reference-free
    rejected_ref: torch.Tensor | None,  # (P,) log π_ref(y_r)
    *,
    beta: float,
    chosen_len: torch.Tensor | None = None,  # (P,) tokens of each chosen response: length-normalised log-ratios
    rejected_len: torch.Tensor | None = None,  # (P,)
    target_margin: float = 0.0,
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO's loss over P pairs (scalar): the sum of −log σ(z) divided by `normaliser` (default P), with

      z = β · (ρ_c − ρ_r) − target_margin,  ρ = log π(y) − log π_ref(y)   (÷ |y| with lengths)

    and stats: the implicit rewards β·ρ of both sides, their margin and the fraction of pairs it ranks right."""
    if (chosen_ref is None) != (rejected_ref is None):
        raise ValueError("dpo_loss needs both reference logprobs, or neither (reference-free)")
    if (chosen_len is None) != (rejected_len is None):
        raise ValueError("dpo_loss needs both response lengths, or neither")
    rho_c, rho_r = chosen_logp, rejected_logp
    if chosen_ref is not None:
        rho_c, rho_r = rho_c - chosen_ref.detach(), rho_r - rejected_ref.detach()
    if chosen_len is not None:
        rho_c, rho_r = rho_c / chosen_len.clamp(min=1), rho_r / rejected_len.clamp(min=1)
    z = beta * (rho_c - rho_r) - target_margin  # (P,)
    losses = -torch.nn.functional.logsigmoid(z)
    loss = losses.sum() / (len(z) if normaliser is None else normaliser)
    reward_c, reward_r = beta * rho_c.detach(), beta * rho_r.detach()
    stats = {
        "dpo_loss": float(losses.detach().mean()),
        "chosen_reward": float(reward_c.mean()),
        "rejected_reward": float(reward_r.mean()),
        "reward_margin": float((reward_c - reward_r).mean()),
        "pair_accuracy": float((reward_c > reward_r).float().mean()),
    }
    return loss, stats


def sft_loss(
    logp: torch.Tensor,  # (B, T) current policy, carries the gradient
    loss_mask: torch.Tensor,  # (B, T) 1 on trained tokens
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Supervised fine-tuning's loss (scalar): the masked tokens' negative log-likelihood summed, divided by
    `normaliser` (default: the masked tokens, a token mean), and its mean per token as `nll`."""
    mask = loss_mask.bool()
    nll = torch.where(mask, -logp, 0.0)
    return aggregate(nll, mask, "token_mean", normaliser), {"nll": _masked_mean(nll.detach(), mask)}
