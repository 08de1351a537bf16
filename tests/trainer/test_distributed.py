"""Two trainer processes (gloo, FSDP2) take the same step as one: same updated weights, same loss.

The ranks are real processes joined by torch.distributed; each builds the same seeded tiny
Llama, shards it, trains its share of the groups and gathers the full weights on rank 0,
which are compared with one process's `train_step` over the whole batch.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import tiny_llama
from trainer import distributed
from trainer.audit import effective_history
from trainer.batch import Sample, pack
from trainer.checkpoint import SHARDED_OPTIMIZER, TrainerState, latest, load_state, save, save_sharded
from trainer.config import TrainerConfig
from trainer.step import padded_cost, train_step

CPU = torch.device("cpu")
# Float32 on CPU: the runs differ only in the order gradients are summed. One AdamW step at lr 1e-2
# moves every weight by about 1e-2; the largest differences measured were 4.6e-6 on an AMD EPYC and
# 1.7e-5 on an Intel Xeon with AMX (the same on every run of a machine: its kernels' summation
# order), both in an element whose gradient is near zero, where Adam's g / sqrt(v) magnifies
# rounding. 1e-4 leaves room for other CPUs and is still a hundredth of one step.
TOLERANCE = 1e-4


def sample(ids: list[int], n_out: int, adv: float) -> Sample:
    mask = [0] * (len(ids) - n_out) + [1] * n_out
    return Sample(
        input_ids=ids,
        loss_mask=mask,
        behav_logprobs=[-2.0 * m for m in mask],
        versions=[0 if m else -1 for m in mask],
        advantages=[adv * m for m in mask],
        temperature=1.0,
    )


SAMPLES = [
    sample([5, 6, 7, 8, 9], 2, 1.0),
    sample([5, 6, 7, 10, 11, 12], 3, -0.5),
    sample([30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41], 4, 0.8),  # a group of its own
    sample([1, 2, 3, 4, 20, 21, 22, 23], 4, -1.0),
    sample([1, 2, 3, 4, 24, 25], 2, 0.3),
    sample([50, 51, 52], 1, 1.5),
]


def config(agg: str) -> TrainerConfig:
    # A large learning rate and a tight clip: the update is far from zero and clipping is active,
    # so a wrong gradient scale or a rank-local norm would show.
    return TrainerConfig.model_validate(
        {"optim": {"lr": 1e-2, "grad_clip": 0.05}, "loss": {"agg": agg}, "batch": {"tokens_per_microbatch": 40}}
    )


CASES = {
    "spread": (SAMPLES, "token_mean"),
    "drgrpo": (SAMPLES, "token_sum_norm"),
    "one_group": (SAMPLES[:2], "token_mean"),  # fewer groups than ranks: rank 1 trains nothing
}


def one_process(case: str) -> tuple[dict[str, torch.Tensor], float]:
    samples, agg = CASES[case]
    model = tiny_llama(tie_word_embeddings=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    result = train_step(model, optimizer, pack(samples, 40, 0), config(agg), CPU, version=0)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, result.loss


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    me = distributed.Rank(rank, world, rank)
    distributed.init(me, CPU, timeout_s=60)
    results = {}
    try:
        for case, (samples, agg) in CASES.items():
            model = tiny_llama(tie_word_embeddings=True)
            sharded = distributed.Sharded(model)
            inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
            cfg = config(agg)
            optimizer = distributed.ShardedOptimizer(inner, sharded, cfg.optim.grad_clip)
            groups = pack(samples, 40, 0)
            [mine] = distributed.shares([groups], me)
            result = distributed.train_step_sharded(optimizer, groups, mine, cfg, CPU, version=0)
            state = distributed.full_state_dict(model, me)
            results[case] = (state, result.loss, model.lm_head.weight is model.model.embed_tokens.weight)
    finally:
        distributed.close()
    if me.is_main:
        torch.save(results, out)


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory) -> dict:
    from trainer.launch.processes import free_port

    out = tmp_path_factory.mktemp("fsdp") / "results.pt"
    mp.spawn(_rank_main, args=(2, free_port(), str(out)), nprocs=2)
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("case", list(CASES))
def test_two_process_step_equals_one_process_step(two_process_results, case):
    expected, loss = one_process(case)
    got, got_loss, tied = two_process_results[case]
    assert tied, "the LM head still shares the embedding's weight under FSDP"
    assert set(got) == set(expected)
    before = tiny_llama(tie_word_embeddings=True).state_dict()
    assert all(not torch.equal(value, before[name]) for name, value in expected.items()), "every weight moves"
    for name, value in expected.items():
        diff = (got[name] - value).abs().max().item()
        assert diff <= TOLERANCE, f"{case}: {name} differs by {diff}"
    assert got_loss == pytest.approx(loss, rel=1e-5, abs=1e-7)


def test_split_balances_cost_and_keeps_order():
    groups = pack(SAMPLES, 40, 0)
    shares = distributed.split(groups, 2)
    position = {id(g): i for i, g in enumerate(groups)}
    assert sorted(position[id(g)] for s in shares for g in s) == list(range(len(groups)))
    for share in shares:
        assert [position[id(g)] for g in share] == sorted(position[id(g)] for g in share)
    costs = [sum(padded_cost([g]) for g in s) for s in shares]
    assert max(costs) - min(costs) <= max(padded_cost([g]) for g in groups)
    assert distributed.split(groups[:1], 3)[1:] == [[], []]


# -- checkpoints: written by N processes, resumed by M ---------------------------------------------
STEP_1, STEP_2 = SAMPLES[:4], SAMPLES[2:]


def _load(folder: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folder)


def _resume_main(rank: int, world: int, port: int, root: str) -> None:
    """Rank side: (1) resume one process's checkpoint and take step 2; (2) take step 1 from
    scratch and write a sharded checkpoint."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    me = distributed.Rank(rank, world, rank)
    distributed.init(me, CPU, timeout_s=60)
    cfg = config("token_mean")
    out = {}
    try:
        for case, start in (("from_one", Path(root) / "one"), ("write", None)):
            model = tiny_llama(tie_word_embeddings=True) if start is None else _load(latest(start))
            sharded = distributed.Sharded(model)
            inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
            optimizer = distributed.ShardedOptimizer(inner, sharded, cfg.optim.grad_clip)
            if start is not None:
                load_state(latest(start), inner, model)
            groups = pack(STEP_2 if start is not None else STEP_1, 40, 0)
            [mine] = distributed.shares([groups], me)
            distributed.train_step_sharded(optimizer, groups, mine, cfg, CPU, version=0)
            full = distributed.gather(model, me)
            if start is not None:
                out[case] = full.state if full else None
            else:
                save_sharded(Path(root) / "two", model, inner, TrainerState(step=1), full)
    finally:
        distributed.close()
    if me.is_main:
        torch.save(out, Path(root) / "from_one.pt")


def one_process_steps(root: Path) -> dict[str, torch.Tensor]:
    """Steps 1 and 2 in one process, checkpointing after step 1; the weights after step 2."""
    cfg = config("token_mean")
    model = tiny_llama(tie_word_embeddings=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_step(model, optimizer, pack(STEP_1, 40, 0), cfg, CPU, version=0)
    save(root / "one", model, optimizer, TrainerState(step=1))
    train_step(model, optimizer, pack(STEP_2, 40, 0), cfg, CPU, version=0)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(expected)
    for name, value in expected.items():
        diff = (got[name] - value).abs().max().item()
        assert diff <= TOLERANCE, f"{name} differs by {diff}"


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor], dict]:
    from trainer.launch.processes import free_port

    root = tmp_path_factory.mktemp("resume")
    expected = one_process_steps(root)
    mp.spawn(_resume_main, args=(2, free_port(), str(root)), nprocs=2)
    return root, expected, torch.load(root / "from_one.pt", weights_only=True)


def test_one_process_checkpoint_resumes_in_two(resumed):
    _, expected, two = resumed
    assert_same(two["from_one"], expected)


def test_two_process_checkpoint_resumes_in_one(resumed):
    root, expected, _ = resumed
    folder = latest(root / "two")
    assert folder is not None and (folder / "model.safetensors").is_file(), "a servable model beside the shards"
    assert not list((root / "two" / "checkpoints").glob(".tmp*")), "renamed once every rank wrote its shard"
    model = _load(folder)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = load_state(folder, optimizer, model)
    assert state.step == 1
    train_step(model, optimizer, pack(STEP_2, 40, 0), config("token_mean"), CPU, version=0)
    assert_same(model.state_dict(), expected)


# -- `areal-proxy train` with two trainer processes -------------------------------------------------
def test_sigkill_of_one_rank_stops_the_run_and_it_resumes_with_one_process(tmp_path):
    """A rank SIGKILLed mid-run: the run stops (no rank waits for ever), and the same command with
    one process resumes from the two processes' last checkpoint; no session trained twice."""
    from tests.trainer.test_resume import steps_done, train, write_config

    config = write_config(tmp_path, threads=1, checkpoint={"every": 1})
    run_dir = tmp_path / "run"
    first = train(config, "trainer.max_steps=5", "trainer.processes=2")
    deadline = time.time() + 600
    while steps_done(run_dir) < 2 and time.time() < deadline and first.poll() is None:
        time.sleep(0.5)
    assert steps_done(run_dir) >= 2, first.communicate()[0][-3000:] if first.poll() is not None else "too slow"
    assert "rank 1 of 2" in (run_dir / "trainer.rank1.log").read_text()
    os.kill(int((run_dir / "trainer.rank1.pid").read_text()), signal.SIGKILL)
    out, _ = first.communicate(timeout=300)
    assert first.returncode != 0, out[-3000:]
    done = latest(run_dir)
    assert done is not None and (done / SHARDED_OPTIMIZER).is_dir(), "the two processes' checkpoint"

    resumed_at = json.loads((done / "trainer_state.json").read_text())["step"]
    # one step past the checkpoint: it resumes, trains on one process, and checkpoints in its format
    second = train(config, f"trainer.max_steps={resumed_at + 1}", "trainer.processes=1")
    out, _ = second.communicate(timeout=900)
    assert second.returncode == 0, out[-3000:]
    assert "resume_from" in (run_dir / "trained_sessions.jsonl").read_text()
    history = effective_history(run_dir)
    assert len(history) == len(set(history)), "a session was trained twice"
    assert steps_done(run_dir) == resumed_at + 1
