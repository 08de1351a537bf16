"""Advantage estimators against numbers worked out by hand."""

import math

import pytest
import torch

from trainer.advantages import (
    ADVANTAGES,
    LENGTH_NORMALISED,
    drgrpo,
    grpo,
    max_variance_subset,
    reinforce_pp,
    rloo,
    token_advantages,
    token_level,
)

# Four groups with unequal sizes and interleaved, non-contiguous ids:
#   group 7  (size 4): rewards 1, 0, 0, 0   mean 0.25, centred 0.75, -0.25, -0.25, -0.25
#   group 3  (size 2): rewards 2, 0         mean 1,    centred 1, -1
#   group 9  (size 3): rewards 3, 3, 3      zero variance -> skipped
#   group 42 (size 1): reward 5             a group of one -> skipped
REWARDS = torch.tensor([1.0, 2.0, 0.0, 3.0, 0.0, 3.0, 0.0, 5.0, 3.0, 0.0])
GROUPS = torch.tensor([7, 3, 7, 9, 7, 9, 3, 42, 9, 7])
SKIPPED = torch.tensor([False, False, False, True, False, True, False, True, True, False])


def _check(adv, expected):
    torch.testing.assert_close(adv.values, torch.tensor(expected), atol=1e-5, rtol=0)
    assert torch.equal(adv.skipped, SKIPPED)
    assert adv.num_skipped == 4


def test_grpo_sample_std():
    # group 7: sum of squares 0.75^2 + 3 * 0.25^2 = 0.75, / (n - 1 = 3) = 0.25, std 0.5
    #          -> 0.75 / 0.5 = 1.5 and -0.25 / 0.5 = -0.5
    # group 3: sum of squares 1 + 1 = 2, / (n - 1 = 1) = 2, std sqrt(2) -> +-1 / sqrt(2) = +-0.70711
    r = 1 / math.sqrt(2)
    _check(grpo(REWARDS, GROUPS, eps=0.0), [1.5, r, -0.5, 0.0, -0.5, 0.0, -r, 0.0, 0.0, -0.5])


def test_grpo_eps_only_shifts_slightly():
    # std 0.5 + 1e-6: 0.75 / 0.500001 = 1.499997
    adv = grpo(REWARDS, GROUPS)
    assert adv.values[0].item() == pytest.approx(0.75 / 0.500001, abs=1e-6)


def test_drgrpo_centres_without_std():
    _check(drgrpo(REWARDS, GROUPS), [0.75, 1.0, -0.25, 0.0, -0.25, 0.0, -1.0, 0.0, 0.0, -0.25])


def test_rloo_leave_one_out():
    # group 7: 1 - mean(0, 0, 0) = 1;   0 - mean(1, 0, 0) = -1/3
    # group 3: 2 - 0 = 2;               0 - 2 = -2
    t = -1 / 3
    _check(rloo(REWARDS, GROUPS), [1.0, 2.0, t, 0.0, t, 0.0, -2.0, 0.0, 0.0, t])


def test_reinforce_pp_global_std():
    # centred rewards of the non-skipped samples: 0.75, -0.25, -0.25, -0.25, 1, -1 (mean 0)
    # sum of squares 0.75 + 2 = 2.75, / (6 - 1) = 0.55, std = 0.741620
    # 0.75 / 0.741620 = 1.011300, -0.25 / 0.741620 = -0.337100, 1 / 0.741620 = 1.348400
    a, b, c = 1.011300, -0.337100, 1.348400
    _check(reinforce_pp(REWARDS, GROUPS, eps=0.0), [a, c, b, 0.0, b, 0.0, -c, 0.0, 0.0, b])


def test_float_equal_rewards_are_skipped_exactly():
    # mean of 0.1, 0.1, 0.1 in float is not exactly 0.1; the group is still flat and gets exact zeros
    rewards = torch.tensor([0.1, 0.1, 0.1])
    for estimator in ADVANTAGES.values():
        adv = estimator(rewards, torch.zeros(3, dtype=torch.long))
        assert torch.equal(adv.values, torch.zeros(3))
        assert adv.num_skipped == 3


def test_all_skipped_batch_is_zero():
    adv = reinforce_pp(torch.tensor([1.0, 1.0, 4.0]), torch.tensor([0, 0, 1]))
    assert torch.equal(adv.values, torch.zeros(3))
    assert adv.num_skipped == 3


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_group_order_and_ids_do_not_matter(name):
    perm = torch.tensor([9, 2, 5, 0, 7, 1, 8, 3, 6, 4])
    base = ADVANTAGES[name](REWARDS, GROUPS)
    shuffled = ADVANTAGES[name](REWARDS[perm], GROUPS[perm] * 100 - 5)
    torch.testing.assert_close(shuffled.values, base.values[perm])
    assert torch.equal(shuffled.skipped, base.skipped[perm])


def test_registry_and_length_normalisation():
    assert set(ADVANTAGES) == {"grpo", "drgrpo", "rloo", "reinforce_pp"}
    assert set(LENGTH_NORMALISED) == set(ADVANTAGES)
    assert LENGTH_NORMALISED["drgrpo"] is False
    assert LENGTH_NORMALISED["grpo"] is True


def test_token_advantages_broadcast():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    out = token_advantages(torch.tensor([2.0, -1.0]), mask)
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]))


def test_token_level_drgrpo_and_rloo():
    # one group, final rewards 1, 0, 0; tree-discounted returns per token, padding in row 1
    seq_rewards = torch.tensor([1.0, 0.0, 0.0])
    groups = torch.tensor([5, 5, 5])
    returns = torch.tensor([[0.81, 0.9, 1.0], [0.0, 0.5, 9.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    # drgrpo: baseline mean 1/3, scale 1
    adv = token_level(returns, seq_rewards, groups, drgrpo, mask)
    t = 1 / 3
    expected = [[0.81 - t, 0.9 - t, 1 - t], [-t, 0.5 - t, 0.0], [-t, -t, -t]]
    torch.testing.assert_close(adv.values, torch.tensor(expected))
    # rloo: baselines mean(0, 0) = 0 for row 0, mean(1, 0) = 0.5 for rows 1 and 2
    adv = token_level(returns, seq_rewards, groups, rloo, mask)
    expected = [[0.81, 0.9, 1.0], [-0.5, 0.0, 0.0], [-0.5, -0.5, -0.5]]
    torch.testing.assert_close(adv.values, torch.tensor(expected))


def test_token_level_grpo_scale_and_skipped_group():
    # group 0: rewards 1, 0 -> mean 0.5, std sqrt(0.5 / 1) = 0.707107; group 1 flat -> zeros, skipped
    seq_rewards = torch.tensor([1.0, 0.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1])
    returns = torch.tensor([[0.9, 1.0], [0.0, 0.0], [1.8, 2.0], [2.0, 2.0]])
    mask = torch.ones(4, 2)
    adv = token_level(returns, seq_rewards, groups, lambda r, g: grpo(r, g, eps=0.0), mask)
    # (0.9 - 0.5) / 0.707107 = 0.565685, (1 - 0.5) / 0.707107 = 0.707107
    expected = [[0.565685, 0.707107], [-0.707107, -0.707107], [0.0, 0.0], [0.0, 0.0]]
    torch.testing.assert_close(adv.values, torch.tensor(expected), atol=1e-5, rtol=0)
    assert adv.skipped.tolist() == [False, False, True, True]


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_token_level_matches_scalar_when_returns_equal_reward(name):
    mask = torch.tensor([[1, 1, 0, 0]] * 5 + [[1, 1, 1, 1]] * 5)
    returns = REWARDS[:, None].expand(10, 4)
    adv = token_level(returns, REWARDS, GROUPS, ADVANTAGES[name], mask)
    expected = token_advantages(ADVANTAGES[name](REWARDS, GROUPS).values, mask)
    torch.testing.assert_close(adv.values, expected)


def test_max_variance_subset_by_hand():
    # A lone success of 8, keep 4: the success and the three earliest failures (variance 3/16, the
    # most any 4 of these can have; without the success it would be 0).
    assert max_variance_subset([0, 0, 0, 0, 1, 0, 0, 0], 4) == [0, 1, 2, 4]
    # Three successes of 8, keep 4: two of each (variance 1/4), the earliest of each.
    assert max_variance_subset([1, 0, 1, 0, 0, 1, 0, 0], 4) == [0, 1, 2, 3]
    # Seven successes of 8: the failure and three successes.
    assert max_variance_subset([1, 1, 1, 1, 1, 1, 0, 1], 4) == [0, 1, 2, 6]
    # Graded rewards 0.0, 0.1, 0.2, 0.5, 0.9, 1.0, keep 3. Variances (population) of the candidates:
    #   lowest 0 + highest 3: {0.5, 0.9, 1.0}  mean 0.8     var 0.0467
    #   lowest 1 + highest 2: {0.0, 0.9, 1.0}  mean 0.6333  var 0.2022
    #   lowest 2 + highest 1: {0.0, 0.1, 1.0}  mean 0.3667  var 0.2022 (a tie: the first is taken)
    #   lowest 3 + highest 0: {0.0, 0.1, 0.2}  mean 0.1     var 0.0067
    assert max_variance_subset([0.5, 0.0, 0.9, 0.2, 1.0, 0.1], 3) == [1, 2, 4]
    # Keep 2 of 0.2, 0.0, 1.0, 0.3: one from each end, 0.0 and 1.0 (variance 1/4).
    assert max_variance_subset([0.2, 0.0, 1.0, 0.3], 2) == [1, 2]
    # At most m: all of them.
    assert max_variance_subset([1, 0], 4) == [0, 1]
