"""GAE over the conversation tree against numbers worked out by hand."""

import random

import pytest
import torch

from rewards.returns import tree_returns
from trainer.gae import Turn, tree_gae, whiten


def _close(got: list[float], expected: list[float]) -> None:
    assert got == pytest.approx(expected, abs=1e-9)


def test_single_turn():
    # γ = 0.9, λ = 0.5 (γλ = 0.45), V = [0.5, 0.2, 0.4], R = 1 on the last token, a leaf: V_3 = A_3 = 0
    #   δ2 = 1 + 0.9·0 − 0.4 = 0.6                A2 = 0.6
    #   δ1 = 0 + 0.9·0.4 − 0.2 = 0.16             A1 = 0.16 + 0.45·0.6 = 0.43
    #   δ0 = 0 + 0.9·0.2 − 0.5 = −0.32            A0 = −0.32 + 0.45·0.43 = −0.1265
    #   returns A + V: 0.3735, 0.63, 1.0
    out = tree_gae({"a": Turn(None, 1.0, [0.5, 0.2, 0.4])}, gamma=0.9, lam=0.5)
    _close(out["a"].advantages, [-0.1265, 0.43, 0.6])
    _close(out["a"].returns, [0.3735, 0.63, 1.0])


def test_chain_of_two_turns():
    # γ = 1, λ = 0.5. a (V = [0.1, 0.3], R = 0) -> b (V = [0.6, 0.8], R = 2), b a leaf.
    #   b: δ1 = 2 − 0.8 = 1.2, A1 = 1.2;  δ0 = 0.8 − 0.6 = 0.2, A0 = 0.2 + 0.5·1.2 = 0.8
    #   a bootstraps from b's first token: V = 0.6, A = 0.8
    #   a: δ1 = 0 + 0.6 − 0.3 = 0.3, A1 = 0.3 + 0.5·0.8 = 0.7;  δ0 = 0.3 − 0.1 = 0.2, A0 = 0.2 + 0.5·0.7 = 0.55
    turns = {"b": Turn("a", 2.0, [0.6, 0.8]), "a": Turn(None, 0.0, [0.1, 0.3])}
    out = tree_gae(turns, gamma=1.0, lam=0.5)
    _close(out["b"].advantages, [0.8, 1.2])
    _close(out["a"].advantages, [0.55, 0.7])
    _close(out["a"].returns, [0.65, 1.0])
    _close(out["b"].returns, [1.4, 2.0])


def test_branching_tree_averages_children():
    # γ = 0.5, λ = 0.8 (γλ = 0.4). p (V = [0.5], R = 0) with children c1 (V = [0.4], R = 1), c2 (V = [0.2], R = 0)
    #   c1: δ = 1 − 0.4 = 0.6 = A;   c2: δ = 0 − 0.2 = −0.2 = A
    #   p bootstraps from the children's mean: V = (0.4 + 0.2)/2 = 0.3, A = (0.6 − 0.2)/2 = 0.2
    #   p: δ = 0 + 0.5·0.3 − 0.5 = −0.35, A = −0.35 + 0.4·0.2 = −0.27
    turns = {"p": Turn(None, 0.0, [0.5]), "c1": Turn("p", 1.0, [0.4]), "c2": Turn("p", 0.0, [0.2])}
    out = tree_gae(turns, gamma=0.5, lam=0.8)
    _close(out["c1"].advantages, [0.6])
    _close(out["c2"].advantages, [-0.2])
    _close(out["p"].advantages, [-0.27])
    _close(out["p"].returns, [0.23])
    # max: the child of largest V + A, c1 (0.4 + 0.6 = 1 > 0): δ = 0.5·0.4 − 0.5 = −0.3, A = −0.3 + 0.4·0.6 = −0.06
    _close(tree_gae(turns, gamma=0.5, lam=0.8, agg="max")["p"].advantages, [-0.06])


def test_turn_without_tokens_passes_its_reward_to_its_parent():
    # γ = 1, λ = 1. p (V = [0.5]) -> e (no tokens, R = 1): p bootstraps V = 1 + 0, A = 0: δ = 1 − 0.5 = 0.5 = A
    out = tree_gae({"p": Turn(None, 0.0, [0.5]), "e": Turn("p", 1.0, [])}, gamma=1.0, lam=1.0)
    _close(out["p"].advantages, [0.5])
    assert out["e"].advantages == [] and out["e"].returns == []


def test_lambda_one_is_discounted_return_minus_value():
    # γ = 0.9 per token. a (2 tokens, R = 0) -> b (1 token, R = 1): G_b0 = 1, G_a1 = 0.9, G_a0 = 0.81,
    # whatever the values: A = G − V.
    turns = {"a": Turn(None, 0.0, [0.3, -0.2]), "b": Turn("a", 1.0, [0.7])}
    out = tree_gae(turns, gamma=0.9, lam=1.0)
    _close(out["a"].advantages, [0.81 - 0.3, 0.9 + 0.2])
    _close(out["b"].advantages, [1.0 - 0.7])
    _close(out["a"].returns, [0.81, 0.9])


def _random_tree(rng: random.Random, n: int) -> dict[str, Turn]:
    turns: dict[str, Turn] = {}
    for i in range(n):
        parent = f"t{rng.randrange(i)}" if i else None
        turns[f"t{i}"] = Turn(
            parent, rng.choice([0.0, 0.0, 1.0, -0.5]), [rng.uniform(-1, 1) for _ in range(rng.randint(1, 4))]
        )
    return turns


def test_lambda_one_gamma_one_matches_tree_returns():
    # With γ = 1 every token of a turn has the turn's tree return (rewards/returns.py, children averaged).
    turns = _random_tree(random.Random(0), 12)
    returns = tree_returns(((i, t.parent_id, t.reward) for i, t in turns.items()), gamma=1.0)
    out = tree_gae(turns, gamma=1.0, lam=1.0)
    for turn_id, turn in turns.items():
        _close(out[turn_id].advantages, [returns[turn_id] - v for v in turn.values])
        _close(out[turn_id].returns, [returns[turn_id]] * len(turn.values))


def test_lambda_zero_is_one_step_td():
    gamma = 0.7
    turns = _random_tree(random.Random(1), 10)
    out = tree_gae(turns, gamma=gamma, lam=0.0)
    for turn_id, turn in turns.items():
        kids = [t.values[0] for t in turns.values() if t.parent_id == turn_id]
        after = sum(kids) / len(kids) if kids else 0.0
        nxt = turn.values[1:] + [after]
        rewards = [0.0] * (len(turn.values) - 1) + [turn.reward]
        _close(out[turn_id].advantages, [r + gamma * v1 - v for r, v1, v in zip(rewards, nxt, turn.values)])


def test_unknown_aggregate_is_refused():
    with pytest.raises(ValueError, match="mean' or 'max"):
        tree_gae({"a": Turn(None, 1.0, [0.0])}, gamma=1.0, lam=1.0, agg="sum")


def test_whiten_over_masked_entries():
    # masked 1, 2, 3: mean 2, std (n − 1) 1 -> −1, 0, 1; the masked-off 100 is ignored and becomes 0
    adv = torch.tensor([[1.0, 2.0, 100.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(whiten(adv, mask, eps=0.0), torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
