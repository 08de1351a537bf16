"""The optimizer: bfloat16 weights train through float32 masters; 8-bit AdamW reduces a loss."""

import importlib.util
import io

import pytest
import torch

from tests.conftest import tiny_llama
from trainer.config import OptimConfig
from trainer.optim import MasterWeights, build_optimizer

CPU = torch.device("cpu")


def _loss(model) -> torch.Tensor:
    ids = torch.arange(24).view(2, 12) % 97
    return model(input_ids=ids, labels=ids).loss


def _steps(model, optimizer, n: int) -> list[float]:
    losses = []
    for _ in range(n):
        optimizer.zero_grad(set_to_none=True)
        loss = _loss(model)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _moved_fraction(model, start: dict[str, torch.Tensor]) -> float:
    """The fraction of weights with |w| > 0.01 that changed: where an update of ~1e-5 is under half a
    bfloat16 ulp (at least 2^-15 ≈ 3e-5 there), so it only lands through a float32 master."""
    moved = total = 0
    for name, value in model.state_dict().items():
        big = start[name].float().abs() > 0.01
        moved += int((value != start[name])[big].sum())
        total += int(big.sum())
    return moved / total


def test_small_updates_survive_bfloat16_through_the_float32_masters():
    # lr 1e-5: each Adam step moves a weight by ~lr. Plain bfloat16 AdamW rounds every one of them
    # away; the masters accumulate ten, ~1e-4, over an ulp, and the rounded weights move.
    o = OptimConfig(lr=1e-5, weight_decay=0.0)
    plain = tiny_llama().to(torch.bfloat16)
    start = {k: v.clone() for k, v in plain.state_dict().items()}
    _steps(plain, torch.optim.AdamW(plain.parameters(), lr=o.lr, betas=o.betas, weight_decay=0.0), 10)

    model = tiny_llama().to(torch.bfloat16)
    optimizer = build_optimizer(list(model.parameters()), o, CPU)
    assert isinstance(optimizer, MasterWeights)
    _steps(model, optimizer, 10)

    assert _moved_fraction(plain, start) == 0.0
    assert _moved_fraction(model, start) > 0.5
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    for p, m in zip(model.parameters(), optimizer.masters):
        assert m.dtype == torch.float32 and torch.equal(p, m.to(torch.bfloat16))  # the weights are the masters rounded


def test_bfloat16_state_dict_round_trips_through_weights_only_load():
    o = OptimConfig(lr=1e-3)
    model = tiny_llama().to(torch.bfloat16)
    optimizer = build_optimizer(list(model.parameters()), o, CPU)
    _steps(model, optimizer, 2)
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)["optimizer"]
    after_two = [m.clone() for m in optimizer.masters]
    _steps(model, optimizer, 1)
    want = [m.clone() for m in optimizer.masters]

    resumed = tiny_llama().to(torch.bfloat16)  # a fresh model: its weights come back from the masters
    again = build_optimizer(list(resumed.parameters()), o, CPU)
    again.load_state_dict(saved)
    for a, b in zip(again.masters, after_two):
        assert torch.equal(a, b)
    again.param_groups[0]["lr"] = o.lr  # what the schedule touches
    _steps(resumed, again, 1)
    for a, b in zip(again.masters, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_float32_params_get_plain_adamw():
    model = tiny_llama()
    assert isinstance(build_optimizer(list(model.parameters()), OptimConfig(), CPU), torch.optim.AdamW)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao (the lowmem extra) not installed")
def test_adamw_8bit_reduces_the_loss():
    model = tiny_llama(hidden_size=256, intermediate_size=512)  # AdamW8bit quantises tensors of 4096+ elements
    optimizer = build_optimizer(list(model.parameters()), OptimConfig(name="adamw_8bit", lr=1e-3), CPU)
    losses = _steps(model, optimizer, 8)
    assert losses[-1] < losses[0] - 0.5
    quantised = [s for s in optimizer.state.values() if "exp_avg" in s and "8" in type(s["exp_avg"]).__name__]
    assert quantised  # the moments of the large tensors are 8-bit


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao (the lowmem extra) not installed")
def test_adamw_8bit_state_dict_round_trips_through_weights_only_load():
    # Checkpoints load the optimizer with weights_only=True: torchao's 8-bit state tensors must pass it.
    o = OptimConfig(name="adamw_8bit", lr=1e-3)
    model = tiny_llama(hidden_size=256, intermediate_size=512)
    optimizer = build_optimizer(list(model.parameters()), o, CPU)
    _steps(model, optimizer, 2)
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "model": model.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    _steps(model, optimizer, 1)
    want = [p.detach().clone() for p in model.parameters()]

    resumed = tiny_llama(hidden_size=256, intermediate_size=512)
    resumed.load_state_dict(saved["model"])
    again = build_optimizer(list(resumed.parameters()), o, CPU)
    again.load_state_dict(saved["optimizer"])
    _steps(resumed, again, 1)
    for a, b in zip(resumed.parameters(), want):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=0)
