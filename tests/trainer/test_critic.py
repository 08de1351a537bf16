"""The critic on the tiny model: values read where the policy's logprobs are, GAE onto packed groups,
and value steps that fit the targets."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import tiny_llama
from trainer.batch import Sample, pack
from trainer.critic import Critic, ValueHead, assign_gae, critic_step, estimate_values, group_values

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama().eval()


def _sample(prompt: list[int], output: list[int], turn: tuple[str, str | None, float]) -> Sample:
    n = len(output)
    return Sample(
        input_ids=prompt + output,
        loss_mask=[0] * len(prompt) + [1] * n,
        behav_logprobs=[0.0] * len(prompt) + [-1.0] * n,
        versions=[-1] * len(prompt) + [0] * n,
        advantages=[0.0] * (len(prompt) + n),
        temperature=1.0,
        turn=turn,
    )


# A session a -> b (b's prompt is a's prompt and reply plus a tool message), and a lone session c.
SAMPLES = [
    _sample([5, 6], [7, 8], ("a", None, 0.0)),
    _sample([5, 6, 7, 8, 9], [10, 11], ("b", "a", 2.0)),
    _sample([3, 4, 5], [12, 13, 14], ("c", None, 1.0)),
]


def _critic(tiny, body=None, seed: int = 1) -> Critic:
    torch.manual_seed(seed)
    head = ValueHead(tiny.config.hidden_size)
    torch.nn.init.normal_(head.proj.weight, std=0.1)  # nonzero, so the comparison below can fail
    params = [{"params": list(head.parameters()), "lr": 1e-2}]
    if body is not None:
        params.append({"params": list(body.parameters()), "lr": 1e-3})
    return Critic(head, torch.optim.Adam(params), body)


def test_values_are_read_where_the_logprobs_are(tiny):
    # V_t = head(hidden state at position t − 1 of the full sequence), the state before token t is sampled
    critic = _critic(tiny)
    groups = pack(SAMPLES, 1000, pad_id=0)
    with torch.no_grad():
        got = [
            g_v[row][g.loss_mask[row]]
            for g in groups
            for g_v in [group_values(critic, tiny, [g], CPU)[0]]
            for row in range(g_v.shape[0])
        ]
        expected = []
        for g in groups:
            for row in range(g.continuation.shape[0]):
                turn = g.turns[row]
                s = next(s for s in SAMPLES if s.turn == turn)
                hidden = tiny.model(torch.tensor([s.input_ids])).last_hidden_state[0]
                at = [t - 1 for t, m in enumerate(s.loss_mask) if m]
                expected.append(critic.head(hidden[at]))
    for g_row, e_row in zip(got, expected):
        torch.testing.assert_close(g_row, e_row, atol=1e-5, rtol=0)


def test_zero_initialised_head_starts_at_zero(tiny):
    critic = Critic(ValueHead(tiny.config.hidden_size), torch.optim.Adam([torch.zeros(1)]))
    groups = pack(SAMPLES, 1000, pad_id=0)
    estimate_values(critic, tiny, groups, CPU, 1000)
    assert all(torch.equal(g.old_values, torch.zeros_like(g.old_values)) for g in groups)


def _with_old_values(groups, values: dict[str, list[float]]):
    for g in groups:
        g.old_values = torch.zeros(g.loss_mask.shape)
        for row, (turn_id, _, _) in enumerate(g.turns):
            g.old_values[row][g.loss_mask[row]] = torch.tensor(values[turn_id])


def test_assign_gae_links_turns_across_groups():
    # a and b fall into different prefix groups; γ = 1, λ = 0.5 as tests/trainer/test_gae.py's chain:
    #   b (V 0.6, 0.8; R 2): A = 0.8, 1.2;  a (V 0.1, 0.3; R 0) bootstraps V 0.6, A 0.8: A = 0.55, 0.7
    #   c alone (V 0.5, 0.5, 0.5; R 1): δ = −0.5 + 0.5 = 0, 0, 1 − 0.5 = 0.5; A = 0.125, 0.25, 0.5
    groups = pack(SAMPLES, 1000, pad_id=0)
    _with_old_values(groups, {"a": [0.1, 0.3], "b": [0.6, 0.8], "c": [0.5, 0.5, 0.5]})
    assign_gae(groups, gamma=1.0, lam=0.5, whitened=False)
    by_turn = {
        g.turns[row][0]: (g.advantages[row][g.loss_mask[row]].tolist(), g.value_targets[row][g.loss_mask[row]].tolist())
        for g in groups
        for row in range(len(g.turns))
    }
    assert by_turn["a"][0] == pytest.approx([0.55, 0.7])
    assert by_turn["b"][0] == pytest.approx([0.8, 1.2])
    assert by_turn["c"][0] == pytest.approx([0.125, 0.25, 0.5])
    assert by_turn["a"][1] == pytest.approx([0.65, 1.0])
    assert all(float(g.advantages[~g.loss_mask].abs().sum()) == 0 for g in groups)
    # whitened: the seven trained tokens' advantages have mean 0 and (n − 1) std 1; targets unchanged
    assign_gae(groups, gamma=1.0, lam=0.5, whitened=True)
    flat = torch.cat([g.advantages[g.loss_mask] for g in groups])
    assert float(flat.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(flat.std()) == pytest.approx(1.0, abs=1e-4)
    assert torch.cat([g.value_targets[g.loss_mask] for g in groups]).tolist() == pytest.approx(
        [t for g in groups for row in range(len(g.turns)) for t in by_turn[g.turns[row][0]][1]]
    )


def test_assign_gae_needs_values():
    groups = pack(SAMPLES, 1000, pad_id=0)
    with pytest.raises(ValueError, match="old_values"):
        assign_gae(groups, gamma=1.0, lam=0.95)


@pytest.mark.parametrize("separate", [False, True])
def test_critic_steps_fit_the_targets(tiny, separate):
    # Fixed targets (the GAE returns of a batch), value clip on: Adam's steps bring the value loss down;
    # a critic on the policy's body leaves the policy's weights as they were.
    body = copy.deepcopy(tiny) if separate else None
    critic = _critic(tiny, body)
    policy_before = [p.detach().clone() for p in tiny.parameters()]
    groups = pack(SAMPLES, 1000, pad_id=0)
    losses = []
    for _ in range(12):
        estimate_values(critic, tiny, groups, CPU, 1000)
        for g in groups:
            g.value_targets = torch.where(g.loss_mask, 1.5, 0.0)
        losses.append(critic_step(critic, tiny, groups, CPU, value_clip=0.2, tokens_per_microbatch=1000)["value_loss"])
    assert all(later < losses[0] for later in losses[1:]), losses
    assert losses[-1] < 0.25 * losses[0], losses
    assert all(torch.equal(p, q) for p, q in zip(tiny.parameters(), policy_before))
    if separate:
        assert any(not torch.equal(p, q) for p, q in zip(body.parameters(), policy_before))


@pytest.mark.parametrize("separate", [False, True])
def test_checkpoint_restores_head_optimizer_and_model(tiny, tmp_path, separate):
    from trainer import critic as critic_mod
    from trainer.config import CriticConfig

    model_dir = tmp_path / "critic_base"
    tiny.save_pretrained(model_dir)
    ccfg = CriticConfig(model=str(model_dir) if separate else "", lr=1e-2)
    built = critic_mod.build(ccfg, tiny, CPU)
    assert (built.body is not None) == separate
    groups = pack(SAMPLES, 1000, pad_id=0)
    estimate_values(built, tiny, groups, CPU, 1000)
    for g in groups:
        g.value_targets = torch.where(g.loss_mask, 1.0, 0.0)
    critic_step(built, tiny, groups, CPU, value_clip=0.2, tokens_per_microbatch=1000)
    ckpt = tmp_path / "step_0000001"
    critic_mod.save(built, ckpt)
    back = critic_mod.build(ccfg, tiny, CPU, resume=ckpt)
    torch.testing.assert_close(back.head.state_dict(), built.head.state_dict(), rtol=0, atol=0)
    saved, loaded = built.optimizer.state_dict(), back.optimizer.state_dict()
    assert loaded["state"].keys() == saved["state"].keys() and loaded["state"]
    for key in saved["state"]:
        torch.testing.assert_close(loaded["state"][key]["exp_avg"], saved["state"][key]["exp_avg"], rtol=0, atol=0)
    if separate:
        for p, q in zip(back.body.parameters(), built.body.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
    # a checkpoint written without a critic: a new one, every value 0
    fresh = critic_mod.build(ccfg, tiny, CPU, resume=tmp_path / "no_critic_here")
    assert float(fresh.head.proj.weight.detach().abs().sum()) == 0.0


def test_critic_section_is_a_strategy_and_says_what_it_needs():
    from proxy.config import ConfigError, load_config

    assert load_config(None, []).trainer.critic is None
    on = load_config(None, ["trainer.critic.lam=0.9"]).trainer.critic
    assert on.lam == 0.9 and on.gamma == 1.0 and on.model == "" and on.whiten
    with pytest.raises(ConfigError, match=r"needs trainer.batch.style = 'individual' and trainer.processes = 1"):
        load_config(None, ["trainer.critic.lam=0.9", "trainer.batch.style=concat"])
    for other in (["trainer.unsolved.advantage=-0.5"], ["trainer.overlong.max_tokens=64"]):
        with pytest.raises(ConfigError, match=r"would be ignored; leave them out with the critic"):
            load_config(None, ["trainer.critic.lam=0.9", *other])
    assert load_config(None, ["trainer.critic.lam=0.9", "trainer.overlong.mask_truncated=true"]).trainer.critic
    with pytest.raises(ConfigError, match=r"value_coef 0.5 shares the policy's body, but trainer.critic.model"):
        load_config(None, ["trainer.critic.value_coef=0.5", "trainer.critic.model=some/small-model"])


def _prepared(tiny, critic) -> list:
    groups = pack(SAMPLES, 1000, pad_id=0)
    estimate_values(critic, tiny, groups, CPU, 1000)
    for g in groups:
        g.value_targets = torch.where(g.loss_mask, 1.5, 0.0)
    return groups


def test_joint_step_trains_head_and_body_on_the_value_loss(tiny):
    # value_coef 1: the head's gradient from the policy's step equals a value step's on the same batch
    # (the head's gradient does not depend on whether the body is detached); the body's gradient gains
    # the value loss's, so it differs from the policy step without a head.
    from trainer.config import TrainerConfig
    from trainer.step import train_step

    cfg = TrainerConfig()
    model = copy.deepcopy(tiny)
    joint = _critic(tiny)
    head = copy.deepcopy(joint.head)
    alone = Critic(head, torch.optim.SGD(head.parameters(), lr=0.0))
    groups = _prepared(tiny, joint)
    still = torch.optim.SGD(model.parameters(), lr=0.0)
    result = train_step(model, still, groups, cfg, CPU, 0, value_head=joint.head, value_coef=1.0, value_clip=0.2)
    with_value = [p.grad.clone() for p in model.parameters()]
    critic_step(alone, tiny, groups, CPU, value_clip=0.2, tokens_per_microbatch=1000)
    for p, q in zip(joint.head.parameters(), alone.head.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5)
    assert result.stats["value_loss"] > 0
    train_step(model, still, groups, cfg, CPU, 0)
    assert any(not torch.allclose(p.grad, g) for p, g in zip(model.parameters(), with_value))


def test_joint_steps_bring_the_value_loss_down(tiny):
    from trainer.config import TrainerConfig
    from trainer.critic import step_head
    from trainer.step import train_step

    cfg = TrainerConfig()
    model = copy.deepcopy(tiny)
    joint = _critic(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(8):
        groups = _prepared(model, joint)
        result = train_step(
            model, optimizer, groups, cfg, CPU, 0, value_head=joint.head, value_coef=1.0, value_clip=0.2
        )
        step_head(joint)
        losses.append(result.stats["value_loss"])
    assert losses[-1] < 0.25 * losses[0], losses


def test_joint_step_under_bfloat16_autocast(tiny):
    # The head on the policy's body runs under the step's autocast: its bfloat16 values are read back
    # into the float32 value loss (a 6-minute arithmetic run with autocast_bf16 failed on its first step).
    from trainer.config import TrainerConfig
    from trainer.step import train_step

    losses = {}
    for autocast in (False, True):
        cfg = TrainerConfig(autocast_bf16=autocast)
        model = copy.deepcopy(tiny)
        joint = _critic(tiny)
        groups = _prepared(tiny, joint)
        still = torch.optim.SGD(model.parameters(), lr=0.0)
        result = train_step(model, still, groups, cfg, CPU, 0, value_head=joint.head, value_coef=1.0, value_clip=0.2)
        losses[autocast] = result.stats["value_loss"]
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in joint.head.parameters())
    assert losses[True] == pytest.approx(losses[False], rel=0.05), losses
