"""Microbatches sized from an activation-memory estimate (`trainer/memory.py`)."""

import copy

import torch

from tests.conftest import tiny_llama
from tests.trainer.test_batch_step import sample
from trainer.batch import Sample, pack
from trainer.config import TrainerConfig
from trainer.memory import GIB, ModelShape, microbatch_budget, pass_bytes
from trainer.step import microbatches, padded_cost, train_step


def _sample(prefix: list[int], reply: list[int], adv: float) -> Sample:
    return sample(prefix + reply, [0] * len(prefix) + [1] * len(reply), adv)


def _groups():
    samples = []
    for g in range(6):  # six prompts of different lengths, two replies each
        prefix = [1 + g] * (4 + 3 * g)
        samples += [_sample(prefix, [10 + g, 20 + g, 30], 1.0), _sample(prefix, [40 + g, 50], -1.0)]
    return pack(samples, tokens_per_microbatch=1000, pad_id=0)


def test_the_packer_keeps_every_pass_under_the_memory_budget():
    model = tiny_llama().train()
    groups = _groups()
    shape = ModelShape.of(model.config, bf16=False)
    whole = pass_bytes(shape, groups, checkpointing=False)
    cfg = TrainerConfig(memory={"microbatch_gb": whole / 3 / GIB})
    fits = microbatch_budget(model, cfg)
    passes = microbatches(groups, tokens_per_microbatch=1 << 30, fits=fits)
    assert len(microbatches(groups, 1 << 30)) == 1, "tokens alone: one pass"
    assert 3 <= len(passes) < len(groups), "the budget splits them, still packing several groups a pass"
    assert [g for p in passes for g in p] == groups
    for p in passes:
        assert pass_bytes(shape, p, False) <= cfg.memory.microbatch_gb * GIB
    # Both limits hold: a token budget tighter than the memory one splits further.
    tight = microbatches(groups, padded_cost(groups[:2]), fits)
    assert len(tight) > len(passes) and all(padded_cost(p) <= padded_cost(groups[:2]) or len(p) == 1 for p in tight)
    # A group over the budget on its own still gets a pass.
    assert microbatches(groups[:2], 1 << 30, lambda gs: False) == [[groups[0]], [groups[1]]]
    assert microbatch_budget(model, TrainerConfig()) is None


def test_the_estimate_grows_with_tokens_and_checkpointing_keeps_one_layer():
    shape = ModelShape.of(tiny_llama(num_hidden_layers=16).config, bf16=False)
    groups = _groups()
    small, large = pass_bytes(shape, groups[:1], False), pass_bytes(shape, groups, False)
    assert large > 3 * small
    assert pass_bytes(shape, groups, True) < large / 2  # 16 layers: their inputs and one layer's activations
    half = ModelShape.of(tiny_llama(num_hidden_layers=16).config, bf16=True)
    assert pass_bytes(half, groups, False) < 0.7 * large


def test_a_step_split_by_the_memory_budget_is_the_same_step():
    tiny = tiny_llama()
    grads = []
    for gb in (0.0, 1e-9):  # no budget: one pass; a tiny one: a pass per group
        model = copy.deepcopy(tiny)
        cfg = TrainerConfig(loss={"agg": "token_mean"}, optim={"grad_clip": 0}, memory={"microbatch_gb": gb})
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), _groups(), cfg, torch.device("cpu"), 0)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
