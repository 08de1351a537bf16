"""On-policy distillation (trainer.algorithm = "distill"): the per-token reverse-KL reward by hand, the teacher's
logprobs against a plain forward, a step that moves the student towards the teacher, and the real trainer loop
with a checkpoint of another run as the teacher.
"""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from proxy.config import load_config
from proxy.store.samples import SessionSamples
from tests.conftest import one_turn_session, run_server, tiny_llama
from trainer import loop
from trainer.batch import pack
from trainer.config import TrainerConfig
from trainer.distill import Distill, KeepAll, token_rewards
from trainer.selection import select
from trainer.step import train_step

PROMPT = [5, 6, 7]


def session(sid: str, output: list[int], behav: list[float], reward: float = 0.0) -> SessionSamples:
    return one_turn_session(sid, output, behav=behav, reward=reward, prompt=tuple(PROMPT))


def test_token_rewards_by_hand():
    teacher = torch.tensor([[-1.0, -2.0, -0.5]])
    behaviour = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[True, True, False]])
    assert token_rewards(teacher, behaviour, mask).tolist() == [[0.5, -1.0, 0.0]]


def test_every_claimed_session_is_trained_rewards_or_not():
    claim = select([session("a", [10], [-1.0], 1.0), session("b", [11], [-1.0], 1.0)], [KeepAll()])
    assert [s.session_id for s in claim.sessions] == ["a", "b"] and claim.flat == [] and claim.skips == []


def plain_logprobs(model, ids: list[int]) -> list[float]:
    lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return [float(lp[t - 1, ids[t]]) for t in range(len(PROMPT), len(ids))]


def test_the_advantages_are_the_teachers_logprobs_less_the_behaviours():
    student, teacher = tiny_llama().eval(), tiny_llama(num_hidden_layers=3).eval()
    outputs = [[10, 11, 12], [20, 21]]
    with torch.no_grad():
        behav = [plain_logprobs(student, PROMPT + o) for o in outputs]
        taught = [plain_logprobs(teacher, PROMPT + o) for o in outputs]
    cfg = TrainerConfig(algorithm="distill", distill={"teacher": "unused", "whiten": False})
    learner = Distill(cfg, teacher=teacher)
    samples = learner.samples([session(f"s{i}", o, b, reward=3.0) for i, (o, b) in enumerate(zip(outputs, behav))])
    groups = pack(samples, 1000, 0)
    stats = learner.teach(groups, torch.device("cpu"))
    got = [g.advantages[r][g.loss_mask[r]].tolist() for g in groups for r in range(g.advantages.shape[0])]
    expected = [[t - b for t, b in zip(ts, bs)] for ts, bs in zip(taught, behav)]
    got, expected = sorted(got, key=len), sorted(expected, key=len)
    assert [len(x) for x in got] == [len(x) for x in expected] == [2, 3]
    for g, e in zip(got, expected):  # reward_coef 0: the sessions' reward 3.0 is not added
        assert g == pytest.approx(e, abs=1e-5)
    kl = -sum(sum(e) for e in expected) / 5
    assert stats["distill_kl"] == pytest.approx(kl, abs=1e-5)


def test_whitened_rewards_have_mean_0_and_std_1_over_the_sampled_tokens():
    student, teacher = tiny_llama().eval(), tiny_llama(num_hidden_layers=3).eval()
    outputs = [[10, 11, 12], [20, 21], [30, 31, 32, 33]]
    with torch.no_grad():
        behav = [plain_logprobs(student, PROMPT + o) for o in outputs]
        raw = torch.tensor(
            [t - b for o, bs in zip(outputs, behav) for t, b in zip(plain_logprobs(teacher, PROMPT + o), bs)]
        )
    learner = Distill(TrainerConfig(algorithm="distill", distill={"teacher": "unused"}), teacher=teacher)
    groups = pack(learner.samples([session(f"s{i}", o, b) for i, (o, b) in enumerate(zip(outputs, behav))]), 1000, 0)
    stats = learner.teach(groups, torch.device("cpu"))
    got = torch.cat([g.advantages[g.loss_mask] for g in groups])
    assert float(got.mean()) == pytest.approx(0.0, abs=1e-5) and float(got.std()) == pytest.approx(1.0, abs=1e-4)
    assert sorted(got.tolist()) == pytest.approx(sorted(((raw - raw.mean()) / raw.std()).tolist()), abs=1e-4)
    assert stats["distill_kl"] == pytest.approx(float(-raw.mean()), abs=1e-5)
    assert all(float(g.advantages[~g.loss_mask].abs().sum()) == 0 for g in groups)


def test_a_step_moves_the_student_towards_the_teacher():
    student, teacher = tiny_llama(), tiny_llama(num_hidden_layers=3).eval()
    cfg = TrainerConfig(algorithm="distill", distill={"teacher": "unused"}, optim={"lr": 3e-3})
    learner = Distill(cfg, teacher=teacher)
    opt = torch.optim.AdamW(student.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    outputs = [torch.randint(1, 97, (6,), generator=gen).tolist() for _ in range(8)]

    def gap() -> float:
        with torch.no_grad():
            return sum(
                sum(
                    abs(s - t) for s, t in zip(plain_logprobs(student, PROMPT + o), plain_logprobs(teacher, PROMPT + o))
                )
                for o in outputs
            )

    before = gap()
    for _ in range(15):
        with torch.no_grad():
            behav = [plain_logprobs(student, PROMPT + o) for o in outputs]
        samples = learner.samples([session(f"s{i}", o, b) for i, (o, b) in enumerate(zip(outputs, behav))])
        groups = pack(samples, cfg.batch.tokens_per_microbatch, 0)
        learner.teach(groups, torch.device("cpu"))
        train_step(student, opt, groups, cfg, torch.device("cpu"), 0)  # PPO's step, as Trainer._passes runs it
    assert gap() < 0.8 * before


def test_distill_needs_a_teacher():
    with pytest.raises(ValueError, match="distill.teacher"):
        TrainerConfig(algorithm="distill")


OPEN = {"model": "m", "messages": [{"role": "user", "content": "Name an animal."}], "max_tokens": 6, "temperature": 1.0}


def test_a_distill_run_trains_from_a_checkpoint_teacher(tmp_path):
    """A checkpoint folder (its `model` holds another model of the same tokenizer) teaches the base model."""
    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

    teacher_dir = tmp_path / "teacher"
    base = resolve_model(DEFAULT_MODEL, load_config(None, []).engine.cache_dir)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():  # a different model of the same tokenizer: the base, its last layer's MLP scaled
        model.model.layers[-1].mlp.down_proj.weight.mul_(1.5)
    (teacher_dir / "model").mkdir(parents=True)
    model.save_pretrained(teacher_dir / "model")
    db_url = f"sqlite:///{tmp_path}/areal.db"
    run_dir = tmp_path / "run"
    with run_server(tmp_path, db_url) as proxy:
        for i in range(4):
            s = proxy.new_session(task_id=f"t{i}")
            assert httpx.post(s["base_url"] + "/chat/completions", json=OPEN, timeout=120).status_code == 200
            assert proxy.post(f"/sessions/{s['session_id']}/finish", json={"reward": 0.0}).status_code == 200
        overrides = [
            f"store.url={db_url}",
            f"proxy.port={proxy.url.rsplit(':', 1)[1]}",
            f"trainer.run_dir={run_dir}",
            "trainer.algorithm=distill",
            f"trainer.distill.teacher={teacher_dir}",
            "trainer.batch.size=4",
            "rollout.group_size=1",
            "trainer.max_steps=1",
        ]
        assert loop.Trainer(load_config(None, overrides)).run() == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r["step"] == 1 and "loss" in r)
    assert step["sessions"] == 4 and abs(step["distill_kl"]) > 1e-4  # the teacher differs from the student
    trained = [json.loads(line) for line in (run_dir / "trained_sessions.jsonl").read_text().splitlines()]
    assert len(trained[0]["trained"]) == 4 and trained[0]["skipped"] == []
    assert step["samples"] == 4
