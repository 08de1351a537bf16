"""Supervised fine-tuning from the store: the loss worked by hand, which sessions rejection sampling keeps (the
threshold, best-of-group, identical episodes once) with the reasons for the rest, and one step on a tiny Llama
whose loss is a plain forward's mean NLL and lowers it."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import run_server, tiny_llama
from tests.trainer.test_dpo import assert_trained_and_resumed, run_twice, scored_groups, session
from trainer.batch import pack
from trainer.config import TrainerConfig
from trainer.losses import sft_loss
from trainer.selection import select
from trainer.sft import BELOW, DUPLICATE, NOT_BEST, KeepAccepted, Sft, accepted, sft_step


def test_sft_loss_by_hand():
    logp = torch.tensor([[-1.0, -2.0, 5.0], [-0.5, 0.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, stats = sft_loss(logp, mask)
    assert float(loss.detach()) == pytest.approx((1.0 + 2.0 + 0.5) / 3)
    assert stats["nll"] == pytest.approx(3.5 / 3)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, 0.0, -1 / 3, 0.0, 0.0])
    loss, _ = sft_loss(logp, mask, normaliser=7.0)  # the step's tokens, over several passes
    assert float(loss.detach()) == pytest.approx(0.5)


CLAIM = [
    session("a0", "a", 0.5, [10]),
    session("a1", "a", 1.0, [11]),
    session("a2", "a", 0.0, [12]),
    session("a3", "a", 2.0, [13]),
    session("a4", "a", 1.0, [14]),
    session("b0", "b", 1.0, [20]),
    session("b1", "b", 1.0, [20]),  # the same tokens as b0
    session("c0", "c", 0.0, [30]),
]


def test_threshold_keeps_every_session_that_reaches_it():
    kept, left_out = accepted(CLAIM, min_reward=1.0, per_group=0, distinct=False)
    assert kept == [1, 3, 4, 5, 6]
    assert left_out == {
        0: (BELOW, "reward 0.5 below sft.min_reward 1"),
        2: (BELOW, "reward 0 below sft.min_reward 1"),
        7: (BELOW, "reward 0 below sft.min_reward 1"),
    }
    assert accepted(CLAIM, min_reward=0.0, per_group=0, distinct=False)[0] == list(range(8)), "at the threshold"


def test_best_of_group_and_identical_episodes_once():
    kept, left_out = accepted(CLAIM, min_reward=1.0, per_group=1, distinct=True)
    assert kept == [3, 5], "a3 (2.0) is a's best; b0 is b's first of two equals"
    assert left_out[1] == left_out[4] == (NOT_BEST, "not among its group's 1 best (sft.per_group)")
    assert left_out[6] == (DUPLICATE, "the same episode as another of its group, trained once")
    kept, left_out = accepted(CLAIM, min_reward=1.0, per_group=2, distinct=True)
    assert kept == [1, 3, 5], "a3 then a1 (the earlier of the two 1.0s)"
    assert left_out[4][0] == NOT_BEST


def test_the_selector_skips_and_counts_with_reasons():
    picked = select(CLAIM, [KeepAccepted(1.0, 1, True)])
    assert [s.session_id for s in picked.sessions] == ["a3", "b0"]
    assert picked.counts == {BELOW: 3, DUPLICATE: 1, NOT_BEST: 2}
    skipped = {(s.counted_as, sid) for s in picked.skips for sid in s.session_ids}
    assert skipped == {(BELOW, "a0"), (BELOW, "a2"), (BELOW, "c0"), (NOT_BEST, "a1"), (NOT_BEST, "a4")} | {
        (DUPLICATE, "b1")
    }
    flat_but_solved = select([session("x0", "x", 1.0, [1]), session("x1", "x", 1.0, [2])], [KeepAccepted(1.0, 0, True)])
    assert len(flat_but_solved.sessions) == 2, "a group solved every time is trained (PPO would skip it)"


def naive_nll(model, ids: list[int], prompt: int = 3) -> list[float]:
    lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return [-float(lp[t - 1, ids[t]]) for t in range(prompt, len(ids))]


def test_a_step_is_the_mean_nll_and_lowers_it():
    tiny = tiny_llama().eval()
    cfg = TrainerConfig(algorithm="sft", batch={"tokens_per_microbatch": 8})  # one pass per prefix group
    samples = Sft(cfg).samples([session("a0", "a", 1.0, [10, 11, 12]), session("b0", "b", 1.0, [40, 41])])
    with torch.no_grad():
        nll = naive_nll(tiny, [5, 6, 7, 10, 11, 12]) + naive_nll(tiny, [5, 6, 7, 40, 41])
    model = copy.deepcopy(tiny)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    groups = pack(samples, 8, 0)
    first = sft_step(model, opt, groups, cfg, torch.device("cpu"))
    assert first.loss == pytest.approx(sum(nll) / 5, abs=1e-5)
    assert first.stats["nll"] == pytest.approx(sum(nll) / 5, abs=1e-5) and first.tokens == 5
    second = sft_step(model, opt, groups, cfg, torch.device("cpu"))
    assert second.loss < first.loss - 0.05


def test_an_sft_run_trains_checkpoints_and_resumes(tmp_path):
    db_url = f"sqlite:///{tmp_path}/areal.db"
    with run_server(tmp_path, db_url) as proxy:
        scored_groups(proxy, [[0.0, 1.0, 0.0, 1.0], [0.0] * 4, [1.0, 0.5, 1.0, 1.0], [0.0] * 4])  # 2 groups a step
        run_dir, rows = run_twice(
            tmp_path,
            proxy,
            db_url,
            ["trainer.algorithm=sft", "trainer.sft.per_group=2", "trainer.batch.size=8", "rollout.group_size=4"],
        )
    first, second = (next(r for r in rows if r["step"] == i and "loss" in r) for i in (1, 2))
    assert first[BELOW] == 6 and first[NOT_BEST] == 0, "g0's two 0.0s and g1's four"
    assert first["nll"] > 0 and first["loss"] == pytest.approx(first["nll"], rel=1e-5)
    assert second[BELOW] == 5 and second[NOT_BEST] + second[DUPLICATE] == 1, "g2: two of its three 1.0s"
    assert_trained_and_resumed(run_dir)
