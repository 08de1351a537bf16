"""DPO from the store: the loss worked by hand (with a frozen reference, reference-free, length-normalised with
SimPO's margin), which pairs a group of sibling sessions gives and what is skipped with which reason, and one
step on a tiny Llama: per-response sums equal a plain forward's, units split over passes give the same gradient,
and the step raises the chosen response's log-ratio over the rejected one's."""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path

import httpx
import pytest
import torch

from proxy.config import load_config
from proxy.store.samples import SessionSamples
from tests.conftest import one_turn_session, run_server, tiny_llama
from trainer import loop
from trainer.config import DpoConfig, TrainerConfig
from trainer.losses import dpo_loss
from trainer.policy import Reference
from trainer.preference import (
    UNPAIRED,
    Dpo,
    PreferencePairs,
    dpo_step,
    pack_group,
    preference_pairs,
    reference_sums,
    response_sums,
)
from trainer.selection import ZERO_VARIANCE, select

CHOSEN = torch.tensor([-2.0, -1.0])
REJECTED = torch.tensor([-3.0, -0.5])


def test_dpo_loss_by_hand_with_a_reference():
    # pair 1: ρ_c = -2 + 2.5 = 0.5, ρ_r = -3 + 2 = -1, z = 0.5 · 1.5 = 0.75, −log σ(0.75) = log(1 + e^-0.75)
    # pair 2: ρ_c = -1 + 1.5 = 0.5, ρ_r = -0.5 + 1 = 0.5, z = 0, −log σ(0) = log 2
    chosen = CHOSEN.clone().requires_grad_()
    loss, stats = dpo_loss(chosen, REJECTED, torch.tensor([-2.5, -1.5]), torch.tensor([-2.0, -1.0]), beta=0.5)
    expected = (0.3868710 + 0.6931472) / 2
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    assert stats["dpo_loss"] == pytest.approx(expected, abs=1e-6)
    assert stats["chosen_reward"] == pytest.approx(0.5 * (0.5 + 0.5) / 2)
    assert stats["rejected_reward"] == pytest.approx(0.5 * (-1.0 + 0.5) / 2)
    assert stats["reward_margin"] == pytest.approx(0.375)
    assert stats["pair_accuracy"] == 0.5, "pair 2 is a tie: not ranked right"
    loss.backward()
    # ∂/∂log π(y_c) = −β σ(−z) / P: σ(−0.75) = 0.3208213, σ(0) = 0.5
    assert chosen.grad.tolist() == pytest.approx([-0.5 * 0.3208213 / 2, -0.5 * 0.5 / 2], abs=1e-6)


def test_reference_free_dpo_drops_the_reference_terms():
    # pair 1: z = 0.5 · (-2 + 3) = 0.5 → log(1 + e^-0.5); pair 2: z = 0.5 · (-1 + 0.5) = -0.25 → log(1 + e^0.25)
    loss, stats = dpo_loss(CHOSEN, REJECTED, None, None, beta=0.5)
    assert float(loss) == pytest.approx((0.4740770 + 0.8259394) / 2, abs=1e-6)
    assert stats["pair_accuracy"] == 0.5
    with pytest.raises(ValueError, match="both reference"):
        dpo_loss(CHOSEN, REJECTED, torch.zeros(2), None, beta=0.5)


def test_length_normalised_dpo_with_simpo_margin():
    # lengths c = [2, 4], r = [3, 1]; γ = 0.1
    # pair 1: -2/2 - (-3/3) = 0 → z = -0.1 → log(1 + e^0.1); pair 2: -1/4 - (-0.5/1) = 0.25 → z = 0.025
    loss, _ = dpo_loss(
        CHOSEN,
        REJECTED,
        None,
        None,
        beta=0.5,
        chosen_len=torch.tensor([2.0, 4.0]),
        rejected_len=torch.tensor([3.0, 1.0]),
        target_margin=0.1,
    )
    assert float(loss) == pytest.approx((0.7443967 + 0.6807253) / 2, abs=1e-6)
    # with a reference the normalised log-ratios: pair 1 (0.5/2 - (-1)/3) = 0.5833, z = 0.2917 - 0.1
    loss, _ = dpo_loss(
        CHOSEN,
        REJECTED,
        torch.tensor([-2.5, -1.5]),
        torch.tensor([-2.0, -1.0]),
        beta=0.5,
        chosen_len=torch.tensor([2.0, 4.0]),
        rejected_len=torch.tensor([3.0, 1.0]),
        target_margin=0.1,
        normaliser=1.0,
    )
    z1, z2 = 0.5 * (0.25 + 1 / 3) - 0.1, 0.5 * (0.125 - 0.5) - 0.1
    assert float(loss) == pytest.approx(math.log1p(math.exp(-z1)) + math.log1p(math.exp(-z2)), abs=1e-6)


# -- pairs ---------------------------------------------------------------------------------------------------
def test_best_against_worst():
    assert preference_pairs([0.5, 1.0, 0.0, 1.0], "best_worst") == [(1, 2)], "the first of the best, of the worst"
    assert preference_pairs([0.0, 1.0, 0.0], "best_worst") == [(1, 0)]
    assert preference_pairs([1.0, 1.0, 1.0], "best_worst") == [], "all equal: no pair"
    assert preference_pairs([1.0], "best_worst") == [], "a lone session: no pair"
    assert preference_pairs([], "best_worst") == []
    assert preference_pairs([0.3, 0.0], "best_worst", min_gap=0.5) == [], "a gap of 0.3 is not above 0.5"


def test_all_pairs_largest_gap_first_ties_never_pair():
    assert preference_pairs([1.0, 0.0, 0.5], "all") == [(0, 1), (0, 2), (2, 1)]
    assert preference_pairs([1.0, 0.0, 0.5], "all", max_pairs=2) == [(0, 1), (0, 2)]
    assert preference_pairs([1.0, 1.0, 0.0], "all") == [(0, 2), (1, 2)], "the two 1.0s do not pair"
    assert preference_pairs([0.0, 0.0, 0.0, 0.0], "all") == []
    assert preference_pairs([1.0, 0.9, 0.0], "all", min_gap=0.5) == [(0, 2), (1, 2)]


@pytest.mark.parametrize("pairs,cap", [("best_worst", 0), ("all", 0), ("all", 3)])
def test_the_sessions_pairs_use_give_the_same_pairs_again(pairs, cap):
    """What the selector keeps, the learner pairs again: the pairs of the used sessions are the same pairs."""
    rng = random.Random(0)
    for _ in range(200):
        rewards = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(rng.randint(1, 8))]
        found = preference_pairs(rewards, pairs, cap)
        used = sorted({k for p in found for k in p})
        again = preference_pairs([rewards[k] for k in used], pairs, cap)
        assert [(used[c], used[r]) for c, r in again] == found, rewards


def session(sid: str, group: str, reward: float, output: list[int]) -> SessionSamples:
    return one_turn_session(sid, output, group=group, reward=reward, temperature=0.7)


def test_pairs_selected_from_a_claim_and_the_rest_skipped_with_reasons():
    claim = [
        session("a0", "a", 1.0, [10]),
        session("a1", "a", 0.0, [11]),
        session("a2", "a", 0.5, [12]),
        session("a3", "a", 1.0, [13]),
        session("b0", "b", 1.0, [14]),
        session("b1", "b", 1.0, [15]),
        session("c0", "c", 0.0, [16]),  # alone in its group
    ]
    picked = select(claim, [PreferencePairs(DpoConfig())])
    assert [s.session_id for s in picked.sessions] == ["a0", "a1"]
    assert picked.counts == {"dpo_pairs": 1, UNPAIRED: 2}
    skips = {(s.counted_as, s.reason): s.session_ids for s in picked.skips}
    assert skips == {
        (ZERO_VARIANCE, "zero reward variance in its group: no preference pair"): ["b0", "b1", "c0"],
        (UNPAIRED, "neither its group's best nor its worst (dpo.pairs = 'best_worst')"): ["a2", "a3"],
    }
    capped = select(claim, [PreferencePairs(DpoConfig(pairs="all", max_pairs=2))])
    assert [s.session_id for s in capped.sessions] == ["a0", "a1", "a3"], "(a0, a1), (a3, a1): gap 1 first"
    assert capped.counts == {"dpo_pairs": 2, UNPAIRED: 1}
    far = select(claim, [PreferencePairs(DpoConfig(min_gap=1.0))])
    assert far.sessions == [] and far.counts == {"dpo_pairs": 0, UNPAIRED: 4}
    assert any("dpo.min_gap 1" in s.reason and s.session_ids == ["a0", "a1", "a2", "a3"] for s in far.skips)


def test_the_learner_builds_each_groups_pairs_from_the_kept_sessions():
    cfg = TrainerConfig(algorithm="dpo", dpo={"pairs": "all"})
    kept = [session("a0", "a", 1.0, [10, 11]), session("a1", "a", 0.0, [12]), session("a2", "a", 0.5, [13])]
    kept += [session("b0", "b", 0.0, [14]), session("b1", "b", 2.0, [15, 16, 17])]
    groups = Dpo(cfg).samples(kept)
    assert [g.pairs for g in groups] == [[(0, 1), (0, 2), (2, 1)], [(1, 0)]]
    a = groups[0].responses
    assert [x.input_ids for r in a for x in r] == [[5, 6, 7, 10, 11], [5, 6, 7, 12], [5, 6, 7, 13]]
    assert all(x.temperature == 1.0 for r in a for x in r), "the model's own distribution, not the sampler's"
    with pytest.raises(ValueError, match="make no pair"):
        Dpo(cfg).samples([session("x", "x", 1.0, [1]), session("y", "x", 1.0, [2])])


def test_config_refuses_what_dpo_and_sft_would_ignore():
    for bad, match in (
        ({"algorithm": "dpo", "critic": {}}, r"\[trainer.critic\] would be ignored"),
        ({"algorithm": "sft", "unsolved": {"advantage": -0.1}}, r"\[trainer.unsolved\]"),
        ({"algorithm": "dpo", "running_mean": {}}, r"\[trainer.running_mean\]"),
        ({"algorithm": "dpo", "loss": {"kl_coef": 0.1}}, "kl_coef"),
        ({"algorithm": "dpo", "pods": {"keep": 2}, "critic": {}}, r"\[trainer.critic\], \[trainer.pods\]"),
        ({"algorithm": "sft", "processes": 2}, "one trainer process"),
        ({"algorithm": "dpo", "dpo": {"max_pairs": 2}}, "caps pairs = 'all'"),
    ):
        with pytest.raises(ValueError, match=match):
            TrainerConfig(**bad)
    assert TrainerConfig(critic={}, loss={"kl_coef": 0.1}).algorithm == "ppo", "PPO's combinations are untouched"


# -- the step on a tiny Llama ----------------------------------------------------------------------------------
@pytest.fixture
def tiny():
    return tiny_llama().eval()


def units(cfg: TrainerConfig, tokens: int):
    kept = [session("a0", "a", 1.0, [10, 11, 12]), session("a1", "a", 0.0, [20, 21])]
    kept += [session("b0", "b", 0.0, [30]), session("b1", "b", 1.0, [40, 41, 42, 43])]
    return [pack_group(u, tokens, 0) for u in Dpo(cfg).samples(kept)]


def naive_sum(model, ids: list[int], prompt: int = 3) -> float:
    lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return float(sum(lp[t - 1, ids[t]] for t in range(prompt, len(ids))))


def test_response_sums_equal_a_plain_forward(tiny):
    cfg = TrainerConfig(algorithm="dpo")
    with torch.no_grad():
        (a, la), (b, lb) = response_sums(tiny, units(cfg, 1000), torch.device("cpu"))
        expected = [naive_sum(tiny, [5, 6, 7, *o]) for o in ([10, 11, 12], [20, 21], [30], [40, 41, 42, 43])]
    assert [*a.tolist(), *b.tolist()] == pytest.approx(expected, abs=1e-5)
    assert [*la.tolist(), *lb.tolist()] == [3, 2, 1, 4]


def test_a_multi_turn_response_sums_every_turn(tiny):
    """A session's response is all it sampled: its turns run as separate prefix groups and their sums add up."""
    two_turns = session("m0", "m", 1.0, [10, 11])
    second = copy.deepcopy(two_turns.individual[0])
    second.completion_id, second.parent_id, second.turn = "c-m0-2", "c-m0", 1
    second.prompt_ids, second.output_ids = [5, 6, 7, 10, 11, 8], [12, 13]
    second.behav_logprobs, second.versions = [-1.0, -1.0], [0, 0]
    two_turns.individual.append(second)
    cfg = TrainerConfig(algorithm="dpo")
    unit = pack_group(Dpo(cfg).samples([two_turns, session("m1", "m", 0.0, [30])])[0], 1000, 0)
    assert unit.owner == [0, 0, 1], "two prefix groups for the first response, one for the second"
    with torch.no_grad():
        [(sums, lengths)] = response_sums(tiny, [unit], torch.device("cpu"))
        expected = naive_sum(tiny, [5, 6, 7, 10, 11]) + naive_sum(tiny, [5, 6, 7, 10, 11, 8, 12, 13], prompt=6)
    assert float(sums[0]) == pytest.approx(expected, abs=1e-5)
    assert lengths.tolist() == [4, 1]


def grads_after_step(model, cfg: TrainerConfig, tokens: int) -> tuple[dict, dict]:
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the gradients only
    packed = units(cfg, tokens)
    reference_sums(Reference(copy.deepcopy(model)), packed, cfg, torch.device("cpu"))
    result = dpo_step(model, opt, packed, cfg, torch.device("cpu"))
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, result.stats


def test_units_in_separate_passes_give_one_passs_gradient(tiny):
    cfg = TrainerConfig(algorithm="dpo", dpo={"beta": 0.5}, optim={"grad_clip": 0.0})
    one, stats = grads_after_step(tiny, cfg, 1000)
    apart, _ = grads_after_step(
        tiny, cfg.model_copy(update={"batch": cfg.batch.model_copy(update={"tokens_per_microbatch": 8})}), 8
    )
    assert one.keys() == apart.keys() and one
    for name in one:
        torch.testing.assert_close(apart[name], one[name], atol=1e-6, rtol=1e-5)
    # the reference is the model itself: every log-ratio 0, z = 0, the loss log 2 a pair
    assert stats["dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert stats["pairs"] == 2


def test_a_step_raises_the_chosen_log_ratio_over_the_rejected(tiny):
    cfg = TrainerConfig(algorithm="dpo", dpo={"beta": 1.0}, optim={"lr": 1e-2})
    model = copy.deepcopy(tiny)
    reference = Reference(copy.deepcopy(tiny).requires_grad_(False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    packed = units(cfg, 1000)
    reference_sums(reference, packed, cfg, torch.device("cpu"))
    first = dpo_step(model, opt, packed, cfg, torch.device("cpu"))
    second = dpo_step(model, opt, packed, cfg, torch.device("cpu"))
    assert first.stats["reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert second.stats["reward_margin"] > 0.05 and second.stats["pair_accuracy"] == 1.0
    assert second.stats["dpo_loss"] < first.stats["dpo_loss"]
    # reference-free: the same direction from the sums alone
    free = TrainerConfig(algorithm="dpo", dpo={"reference": "none"})
    with torch.no_grad():
        (a, _), (b, _) = response_sums(model, units(free, 1000), torch.device("cpu"))
        (a0, _), (b0, _) = response_sums(tiny, units(free, 1000), torch.device("cpu"))
    assert float((a[0] - a[1]) - (a0[0] - a0[1])) > 0 and float((b[1] - b[0]) - (b0[1] - b0[0])) > 0


# -- the real trainer loop, against a real proxy and store ------------------------------------------------------
OPEN = {"model": "m", "messages": [{"role": "user", "content": "Name an animal."}], "max_tokens": 6, "temperature": 1.0}


def scored_groups(proxy, rewards: list[list[float]]) -> None:
    """One finished group per list of rewards, its sessions sampled from one prompt."""
    for g, group in enumerate(rewards):
        created = proxy.post("/sessions", json={"count": len(group), "group_id": f"g{g}", "task_id": f"t{g}"})
        for s, reward in zip(created.json()["data"], group):
            assert httpx.post(s["base_url"] + "/chat/completions", json=OPEN, timeout=600).status_code == 200
            assert proxy.post(f"/sessions/{s['session_id']}/finish", json={"reward": reward}).status_code == 200


def run_twice(tmp_path, proxy, db_url: str, extra: list[str]) -> tuple[Path, list[dict]]:
    """A trainer run of one step, then the same run resumed for a second: the run_dir and metrics.jsonl's rows."""
    run_dir = tmp_path / "run"
    overrides = [
        f"store.url={db_url}",
        f"proxy.port={proxy.url.rsplit(':', 1)[1]}",
        f"trainer.run_dir={run_dir}",
        "trainer.checkpoint.every=1",
        "trainer.max_staleness=10",  # every session was sampled by the base weights
        *extra,
    ]
    for steps in (1, 2):
        assert loop.Trainer(load_config(None, [*overrides, f"trainer.max_steps={steps}"])).run() == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, rows


def assert_trained_and_resumed(run_dir: Path) -> None:
    """Each step moved the weights; the second run resumed the first's checkpoint and optimizer."""
    from safetensors.torch import load_file

    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

    base = load_file(Path(resolve_model(DEFAULT_MODEL, load_config(None, []).engine.cache_dir)) / "model.safetensors")
    steps = [load_file(run_dir / "checkpoints" / f"step_000000{i}" / "model.safetensors") for i in (1, 2)]
    name = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(steps[0][name], base[name]), "step 1 moved the weights"
    assert not torch.equal(steps[1][name], steps[0][name]), "step 2 moved them on"
    blob = torch.load(run_dir / "checkpoints" / "step_0000002" / "trainer.pt", weights_only=True)
    assert {float(s["step"]) for s in blob["optimizer"]["state"].values()} == {2.0}, "the optimizer went on from step 1"
    audit = [json.loads(line) for line in (run_dir / "trained_sessions.jsonl").read_text().splitlines()]
    assert [e.get("step", e.get("resume_from")) for e in audit] == [1, 1, 2]


def test_a_dpo_run_trains_checkpoints_and_resumes(tmp_path):
    db_url = f"sqlite:///{tmp_path}/areal.db"
    with run_server(tmp_path, db_url) as proxy:
        scored_groups(proxy, [[0.0, 1.0, 0.0, 1.0], [1.0] * 4, [0.5, 0.0, 1.0, 0.0], [0.0] * 4])  # 2 groups a step
        run_dir, rows = run_twice(
            tmp_path, proxy, db_url, ["trainer.algorithm=dpo", "trainer.batch.size=8", "rollout.group_size=4"]
        )
    first, second = (next(r for r in rows if r["step"] == i and "loss" in r) for i in (1, 2))
    assert first["dpo_pairs"] == 1 and first["skipped_unpaired"] == 2 and first["skipped_zero_variance"] == 4
    assert first["dpo_loss"] == pytest.approx(math.log(2), abs=1e-4), "the policy starts as its frozen reference"
    assert second["dpo_pairs"] == 1 and second["skipped_unpaired"] == 2 and second["skipped_zero_variance"] == 4
    assert_trained_and_resumed(run_dir)
