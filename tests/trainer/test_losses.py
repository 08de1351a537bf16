"""Decoupled PPO loss and proximal interpolation against numbers worked out by hand."""

import math

import pytest
import torch

from trainer.losses import (
    loss_denominator,
    policy_loss,
    proximal_logprobs_interpolate,
    second_moment_keep,
    value_loss,
)
from trainer.step import m2po_keeps

LN = math.log
DEFAULTS = {
    "eps_clip": 0.2,
    "eps_clip_high": 0.28,
    "behav_cap": 0.0,
    "behav_cap_mode": "mask",
    "ratio_level": "token",
    "loss_agg": "token_mean",
}


def _loss(log_ratio, adv, *, prox_minus_behav=None, mask=None, **kwargs):
    """policy_loss with prox = 0 and logp = log_ratio (a leaf); returns (loss, stats, d loss / d logp)."""
    logp = torch.tensor(log_ratio, dtype=torch.float32, requires_grad=True)
    prox = torch.zeros_like(logp)
    behav = prox - (torch.tensor(prox_minus_behav) if prox_minus_behav is not None else 0.0)
    mask = torch.ones_like(prox) if mask is None else torch.tensor(mask)
    loss, stats = policy_loss(logp, prox, behav, torch.tensor(adv), mask, **{**DEFAULTS, **kwargs})
    loss.backward()
    return loss.item(), stats, logp.grad


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-5, rtol=0)


def test_on_policy_unclipped():
    # ratio 1, weight 1: token losses -1 * 1 = -1 and -1 * (-2) = 2, token mean 0.5
    # d(-ratio * A) / d logp = -ratio * A -> -1 and 2, / 2 tokens
    loss, stats, grad = _loss([[0.0, 0.0]], [[1.0, -2.0]])
    assert loss == pytest.approx(0.5)
    _close(grad, [[-0.5, 1.0]])
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["clip_frac_low"] == stats["clip_frac_high"] == 0.0


def test_positive_advantage_clipped_above_one_plus_eps_high():
    # A = 1. ratio 1.5 > 1.28: min(1.5, 1.28) = 1.28, no gradient.
    #        ratio 1.1 inside: -1.1, gradient -1.1.
    #        ratio 0.5 below 0.8: min(0.5, 0.8) = 0.5, a positive advantage is never clipped below.
    # token mean (-1.28 - 1.1 - 0.5) / 3 = -0.96; gradients 0, -1.1 / 3, -0.5 / 3
    loss, stats, grad = _loss([[LN(1.5), LN(1.1), LN(0.5)]], [[1.0, 1.0, 1.0]])
    assert loss == pytest.approx(-0.96)
    _close(grad, [[0.0, -1.1 / 3, -0.5 / 3]])
    assert stats["clip_frac_high"] == pytest.approx(1 / 3)
    assert stats["clip_frac_low"] == 0.0


def test_negative_advantage_clipped_below_one_minus_eps():
    # A = -1. ratio 0.5 < 0.8: min(-0.5, -0.8) = -0.8 -> loss 0.8, no gradient.
    #         ratio 1.5 above 1.28: min(-1.5, -1.28) = -1.5 -> loss 1.5, never clipped above; grad 1.5.
    # token mean (0.8 + 1.5) / 2 = 1.15; gradients 0, 1.5 / 2
    loss, stats, grad = _loss([[LN(0.5), LN(1.5)]], [[-1.0, -1.0]])
    assert loss == pytest.approx(1.15)
    _close(grad, [[0.0, 0.75]])
    assert stats["clip_frac_low"] == pytest.approx(0.5)
    assert stats["clip_frac_high"] == 0.0


def test_behaviour_weight_scales_loss_and_gradient():
    # prox / behav = 2, ratio 1, A = 1: loss -2, gradient -2
    loss, stats, grad = _loss([[0.0]], [[1.0]], prox_minus_behav=[[LN(2.0)]])
    assert loss == pytest.approx(-2.0)
    _close(grad, [[-2.0]])
    assert stats["behav_weight_mean"] == pytest.approx(2.0)


def test_behaviour_cap_modes():
    # weights 2 and 8, cap 5, ratio 1, A = 1
    kw = {"prox_minus_behav": [[LN(2.0), LN(8.0)]], "behav_cap": 5.0}
    # mask: token losses -2, 0; the masked token still counts: (-2 + 0) / 2 = -1; gradients -1, 0
    loss, stats, grad = _loss([[0.0, 0.0]], [[1.0, 1.0]], behav_cap_mode="mask", **kw)
    assert loss == pytest.approx(-1.0)
    _close(grad, [[-1.0, 0.0]])
    assert stats["behav_capped_frac"] == pytest.approx(0.5)
    assert stats["behav_weight_mean"] == pytest.approx(5.0)  # (2 + 8) / 2, before the cap
    # clamp: -2, -5 -> -3.5; gradients -2 / 2, -5 / 2
    loss, stats, grad = _loss([[0.0, 0.0]], [[1.0, 1.0]], behav_cap_mode="clamp", **kw)
    assert loss == pytest.approx(-3.5)
    _close(grad, [[-1.0, -2.5]])
    assert stats["behav_capped_frac"] == pytest.approx(0.5)
    # cap 0 disables: -2, -8 -> -5
    loss, stats, _ = _loss([[0.0, 0.0]], [[1.0, 1.0]], **{**kw, "behav_cap": 0.0})
    assert loss == pytest.approx(-5.0)
    assert stats["behav_capped_frac"] == 0.0


def test_two_sided_behaviour_mask_icepop():
    # weights 0.25, 1 and 8 with floor 0.5 and cap 5; ratio 1, A = 1
    kw = {"prox_minus_behav": [[LN(0.25), 0.0, LN(8.0)]], "behav_cap": 5.0, "behav_floor": 0.5}
    # mask: 0.25 below the floor and 8 over the cap are both dropped: (0 - 1 + 0) / 3; gradients 0, -1/3, 0
    loss, stats, grad = _loss([[0.0] * 3], [[1.0] * 3], behav_cap_mode="mask", **kw)
    assert loss == pytest.approx(-1 / 3)
    _close(grad, [[0.0, -1 / 3, 0.0]])
    assert stats["behav_floored_frac"] == pytest.approx(1 / 3)
    assert stats["behav_capped_frac"] == pytest.approx(1 / 3)
    # clamp: 0.25 raised to 0.5, 8 lowered to 5: (-0.5 - 1 - 5) / 3 = -2.166667; gradients the weights / 3
    loss, stats, grad = _loss([[0.0] * 3], [[1.0] * 3], behav_cap_mode="clamp", **kw)
    assert loss == pytest.approx(-6.5 / 3)
    _close(grad, [[-0.5 / 3, -1 / 3, -5 / 3]])
    # floor 0 (the default) is today's one-sided cap: (-0.25 - 1 + 0) / 3, and no floor statistic
    loss, stats, _ = _loss([[0.0] * 3], [[1.0] * 3], **{**kw, "behav_floor": 0.0})
    assert loss == pytest.approx(-1.25 / 3)
    assert "behav_floored_frac" not in stats


def test_two_sided_mask_at_sequence_level_bounds_the_geometric_mean():
    # weights 0.25 and 1: exp(mean(ln 0.25, ln 1)) = 0.5 < floor 0.6 masks the whole sequence, although
    # the second token alone (weight 1) is inside [0.6, 5]; floor 0.4 keeps it: -0.5 per token -> -0.5
    kw = {"prox_minus_behav": [[LN(0.25), 0.0]], "behav_cap": 5.0, "ratio_level": "sequence"}
    loss, stats, _ = _loss([[0.0, 0.0]], [[1.0, 1.0]], behav_floor=0.6, **kw)
    assert loss == 0.0 and stats["behav_floored_frac"] == 1.0
    loss, stats, _ = _loss([[0.0, 0.0]], [[1.0, 1.0]], behav_floor=0.4, **kw)
    assert loss == pytest.approx(-0.5) and stats["behav_floored_frac"] == 0.0


def test_second_moment_keep_masks_the_largest_until_the_mean_fits():
    # log w 0.1, -0.5, 0.3, 0 -> M2 0.01, 0.25, 0.09, 0: mean 0.35 / 4 = 0.0875
    log_w = torch.tensor([0.1, -0.5, 0.3, 0.0])
    assert second_moment_keep(log_w, 0.1).tolist() == [True] * 4  # 0.0875 <= 0.1: nothing masked
    # tau 0.04 (the paper's): mask 0.25 -> (0.01 + 0.09 + 0) / 3 = 0.0333 <= 0.04
    assert second_moment_keep(log_w, 0.04).tolist() == [True, False, True, True]
    # tau 0.03: 0.0333 is still over; mask 0.09 too -> (0.01 + 0) / 2 = 0.005
    assert second_moment_keep(log_w, 0.03).tolist() == [True, False, False, True]
    # "at most": M2 0.25, 0.0625, 0 with tau 0.03125; masking 0.25 leaves (0.0625 + 0) / 2 = 0.03125 exactly
    assert second_moment_keep(torch.tensor([0.5, 0.25, 0.0]), 0.03125).tolist() == [False, True, True]
    # equal M2 (1, 1, 0), tau 0.5: mean 2/3; the earlier of the two goes first, leaving (1 + 0) / 2 = 0.5
    assert second_moment_keep(torch.tensor([1.0, -1.0, 0.0]), 0.5).tolist() == [False, True, True]
    # every M2 over tau: nothing is left
    assert second_moment_keep(torch.tensor([1.0, -1.0]), 0.5).tolist() == [False, False]
    assert second_moment_keep(torch.zeros(0), 0.04).tolist() == []


def test_m2po_mask_is_chosen_over_the_whole_pass():
    # Group a (1 x 3): log w 0.5, 0 and a padding token; group b (2 x 2): 0.25, 0 / 0 and padding.
    # Trained M2 in pass order: 0.25, 0 | 0.0625, 0, 0 -> mean 0.3125 / 5 = 0.0625 > tau 0.02.
    # Masking 0.25 leaves 0.0625 / 4 = 0.015625 <= 0.02: b keeps everything, although on its own
    # (0.0625 / 3 = 0.0208 > 0.02) its 0.25 token would have been masked.
    behavs = [torch.zeros(1, 3), torch.zeros(2, 2)]
    proxs = [torch.tensor([[0.5, 0.0, 9.0]]), torch.tensor([[0.25, 0.0], [0.0, 9.0]])]
    masks = [torch.tensor([[1, 1, 0]]), torch.tensor([[1, 1], [1, 0]])]
    keep_a, keep_b = m2po_keeps(proxs, behavs, masks, 0.02)
    assert keep_a.tolist() == [[False, True, False]]
    assert keep_b.tolist() == [[True, True], [True, False]]
    assert m2po_keeps(proxs[1:], behavs[1:], masks[1:], 0.02)[0].tolist() == [[False, True], [True, False]]


def test_m2po_kept_tokens_in_the_loss():
    # weights 2, 1, 1 (log w ln 2, 0, 0); ratio 1; A = 1, 1, -2; M2PO keeps tokens 1 and 3
    # token losses -2, 0 (masked), 2 -> 0 / 3 tokens (the masked one still counts); gradients -2/3, 0, 2/3
    # M2 = (ln 2)^2 / 3 = 0.480453 / 3 = 0.160151, before the mask; a third of the tokens masked
    keep = torch.tensor([[True, False, True]])
    loss, stats, grad = _loss([[0.0] * 3], [[1.0, 1.0, -2.0]], prox_minus_behav=[[LN(2.0), 0.0, 0.0]], keep=keep)
    assert loss == pytest.approx(0.0, abs=1e-7)
    _close(grad, [[-2 / 3, 0.0, 2 / 3]])
    assert stats["m2"] == pytest.approx(0.160151, abs=1e-6)
    assert stats["m2po_masked_frac"] == pytest.approx(1 / 3)
    # without the mask: -2, -1, 2 -> -1/3
    loss, stats, _ = _loss([[0.0] * 3], [[1.0, 1.0, -2.0]], prox_minus_behav=[[LN(2.0), 0.0, 0.0]])
    assert loss == pytest.approx(-1 / 3)
    assert "m2po_masked_frac" not in stats


def test_proximal_interpolation():
    behav = torch.tensor([[-2.0, -2.0, -2.0, -1.0]])
    current = torch.tensor([[-1.0, -1.0, -1.0, -3.0]], requires_grad=True)
    versions = torch.tensor([[2, 4, 5, 0]])
    prox = proximal_logprobs_interpolate(behav, current, versions, current_version=5, proximal_version=4)
    # v_b = 2: alpha = (4 - 2) / (5 - 2) = 2/3 -> -2 + 2/3 * (-1 + 2) = -4/3
    # v_b = 4: alpha = 0 -> behaviour -2
    # v_b = 5: sampled by the current version -> current -1
    # v_b = 0: alpha = 4/5 -> -1 + 0.8 * (-3 + 1) = -2.6
    _close(prox, [[-4 / 3, -2.0, -1.0, -2.6]])
    assert not prox.requires_grad
    # v_p = 3 below v_b = 4: alpha = (3 - 4) / (5 - 4) = -1 clamped to 0 -> behaviour
    prox = proximal_logprobs_interpolate(behav, current, versions, current_version=5, proximal_version=3)
    assert prox[0, 1].item() == -2.0


def test_sequence_ratio_gspo():
    # Row 0: log ratios 0.2, -0.1 and a padding token with logp 0, prox -100 (exp(100) overflows float32).
    #   s = exp((0.2 - 0.1) / 2) = exp(0.05) = 1.051271, inside [0.8, 1.28]; A = 1
    #   token losses -1.051271, -1.051271; per-token gradient -s * A, GSPO's d(-s A)/d logp_t = -s / 2.
    # Row 1: log ratios 0.6, 0.2: s = exp(0.4) = 1.491825 > 1.28 -> clipped, no gradient,
    #   although token 2 alone (ratio exp(0.2) = 1.221) would not be clipped.
    logp = torch.tensor([[0.2, -0.1, 0.0], [0.6, 0.2, 0.0]], requires_grad=True)
    prox = torch.tensor([[0.0, 0.0, -100.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.ones(2, 3)
    kw = {**DEFAULTS, "ratio_level": "sequence", "loss_agg": "seq_mean"}
    loss, stats = policy_loss(logp, prox, prox, adv, mask, **kw)
    loss.backward()
    # seq_mean: (-1.051271 + -1.28) / 2 = -1.165636; row 0 grads -s / 2 / 2 sequences
    assert loss.item() == pytest.approx(-1.165636, abs=1e-5)
    _close(logp.grad, [[-0.262818, -0.262818, 0.0], [0.0, 0.0, 0.0]])
    assert stats["clip_frac_high"] == pytest.approx(0.5)
    assert stats["ratio_mean"] == pytest.approx((1.051271 + 1.491825) / 2, abs=1e-5)


def test_sequence_behaviour_weight_is_geometric_mean():
    # prox / behav = 2 and 8: exp(mean(ln 2, ln 8)) = exp(ln 4) = 4 < cap 5, nothing capped
    # (at token level the second token, weight 8, would be). ratio 1, A = 1: loss -4.
    kw = {"prox_minus_behav": [[LN(2.0), LN(8.0)]], "behav_cap": 5.0, "ratio_level": "sequence"}
    loss, stats, _ = _loss([[0.0, 0.0]], [[1.0, 1.0]], **kw)
    assert loss == pytest.approx(-4.0)
    assert stats["behav_capped_frac"] == 0.0
    # cap 3 < 4 masks the whole sequence
    loss, stats, _ = _loss([[0.0, 0.0]], [[1.0, 1.0]], **{**kw, "behav_cap": 3.0})
    assert loss == 0.0
    assert stats["behav_capped_frac"] == 1.0


def test_kl_k3_penalty():
    # logp = ln 0.5, ref = ln 0.25: d = ref - logp = ln 0.5 = -0.693147
    # k3 = exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147; A = 0 so the loss is 0.1 * k3 = 0.0193147
    # d k3 / d logp = -exp(d) + 1 = 0.5 -> gradient 0.1 * 0.5 = 0.05
    logp = torch.tensor([[LN(0.5)]], requires_grad=True)
    ref = torch.tensor([[LN(0.25)]])
    loss, stats = policy_loss(
        logp, logp.detach(), logp.detach(), torch.zeros(1, 1), torch.ones(1, 1),
        ref_logp=ref, kl_coef=0.1, **DEFAULTS,
    )  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(0.0193147, abs=1e-6)
    assert stats["kl"] == pytest.approx(0.193147, abs=1e-6)
    _close(logp.grad, [[0.05]])


def test_entropy_bonus():
    # ratio 1, A = [1, 0, 5] with the third token masked out; entropies H = [0.5, 1.0, 9.0].
    # token losses -1 - 0.1 * 0.5 = -1.05 and 0 - 0.1 * 1.0 = -0.1; token mean over 2: -0.575
    # d loss / d H = -0.1 / 2 on the two trained tokens, 0 on the masked one; logged entropy 0.75
    logp = torch.zeros(1, 3, requires_grad=True)
    ent = torch.tensor([[0.5, 1.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0, 0.0, 5.0]])
    loss, stats = policy_loss(logp, logp.detach(), logp.detach(), adv, mask, entropy=ent, entropy_coef=0.1, **DEFAULTS)
    loss.backward()
    assert loss.item() == pytest.approx(-0.575)
    _close(ent.grad, [[-0.05, -0.05, 0.0]])
    assert stats["entropy"] == pytest.approx(0.75)
    # coefficient 0: the entropy is logged and changes nothing
    plain, _ = policy_loss(logp, logp.detach(), logp.detach(), adv, mask, **DEFAULTS)
    logged, stats = policy_loss(logp, logp.detach(), logp.detach(), adv, mask, entropy=ent.detach(), **DEFAULTS)
    assert logged.item() == plain.item() == pytest.approx(-0.5)
    assert stats["entropy"] == pytest.approx(0.75)


def test_aggregation_modes():
    # ratio 1, weight 1: token loss -A. Masked: row 0 -> 1, 2, 3; row 1 -> 4 (padding holds 9s)
    adv = [[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]]
    mask = [[1, 1, 1], [1, 0, 0]]
    zeros = [[0.0] * 3] * 2
    # token_mean: -(1 + 2 + 3 + 4) / 4 = -2.5
    assert _loss(zeros, adv, mask=mask)[0] == pytest.approx(-2.5)
    # seq_mean: row means -2 and -4 -> -3
    assert _loss(zeros, adv, mask=mask, loss_agg="seq_mean")[0] == pytest.approx(-3.0)
    # token_sum_norm (Dr. GRPO): -10 / (2 sequences * 3 positions) = -1.666667
    assert _loss(zeros, adv, mask=mask, loss_agg="token_sum_norm")[0] == pytest.approx(-10 / 6)
    # with a constant max_new_tokens of 8: -10 / (2 * 8) = -0.625
    loss = _loss(zeros, adv, mask=mask, loss_agg="token_sum_norm", normaliser=16.0)[0]
    assert loss == pytest.approx(-0.625)


def test_loss_denominator():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert loss_denominator(mask, "token_mean") == 4.0
    assert loss_denominator(mask, "seq_mean") == 2.0  # the empty row does not count
    assert loss_denominator(mask, "token_sum_norm") == 9.0
    with pytest.raises(ValueError, match="loss_agg"):
        loss_denominator(mask, "mean")


def test_empty_mask_is_zero_not_nan():
    loss, _, grad = _loss([[0.3, 0.1]], [[1.0, 1.0]], mask=[[0, 0]])
    assert loss == 0.0
    _close(grad, [[0.0, 0.0]])


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean", "token_sum_norm"])
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_microbatch_normaliser_equals_full_batch(loss_agg, ratio_level):
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=gen)
    prox = logp + 0.3 * torch.randn(4, 5, generator=gen)
    behav = prox + 0.5 * torch.randn(4, 5, generator=gen)
    adv = torch.randn(4, 5, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    kw = {**DEFAULTS, "behav_cap": 1.5, "ratio_level": ratio_level, "loss_agg": loss_agg}

    full = logp.clone().requires_grad_()
    loss, _ = policy_loss(full, prox, behav, adv, mask, **kw)
    loss.backward()

    halves = logp.clone().requires_grad_()
    normaliser = loss_denominator(mask, loss_agg)
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        part, _ = policy_loss(halves[rows], prox[rows], behav[rows], adv[rows], mask[rows], normaliser=normaliser, **kw)
        part.backward()
        total += part.item()
    assert total == pytest.approx(loss.item(), abs=1e-6)
    torch.testing.assert_close(halves.grad, full.grad)


def test_bad_modes_raise():
    with pytest.raises(ValueError, match="ratio_level"):
        _loss([[0.0]], [[1.0]], ratio_level="seq")
    with pytest.raises(ValueError, match="behav_cap_mode"):
        _loss([[0.0]], [[1.0]], behav_cap_mode="drop")


def test_value_loss_clipped_by_hand():
    # ε_v = 0.2, token_mean over the 3 masked tokens (the 4th is masked out):
    #   t0: V 1, V_old 0.5 -> clip 0.7, R 0: (V − R)² = 1 > (0.7 − 0)² = 0.49: 0.5·1 = 0.5, grad V − R = 1
    #   t1: V 1, V_old 0.5 -> clip 0.7, R 2: (1 − 2)² = 1 < (0.7 − 2)² = 1.69: 0.5·1.69 = 0.845, grad 0 (clip saturated)
    #   t2: V = V_old = 0.5, R 1: both 0.25: 0.125, grad V − R = −0.5
    #   loss (0.5 + 0.845 + 0.125) / 3 = 0.49; grads divided by 3; clipped branch chosen on 1 of 3
    values = torch.tensor([[1.0, 1.0, 0.5, 2.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[0.0, 2.0, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = value_loss(values, old, returns, mask, value_clip=0.2)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.49)
    torch.testing.assert_close(values.grad, torch.tensor([[1 / 3, 0.0, -0.5 / 3, 0.0]]))
    assert stats["value_clip_frac"] == pytest.approx(1 / 3)
    assert stats["value_loss"] == pytest.approx(0.49)


def test_value_loss_unclipped_by_hand():
    # value_clip 0: plain 0.5·(V − R)²: (0.5 + 0.5 + 0.125) / 3 = 0.375, t1's grad (1 − 2) / 3
    values = torch.tensor([[1.0, 1.0, 0.5, 2.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    loss, stats = value_loss(
        values, old, torch.tensor([[0.0, 2.0, 1.0, 9.0]]), torch.tensor([[1, 1, 1, 0]]), value_clip=0.0
    )
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.375)
    torch.testing.assert_close(values.grad, torch.tensor([[1 / 3, -1 / 3, -0.5 / 3, 0.0]]))
    assert stats["value_clip_frac"] == 0.0
