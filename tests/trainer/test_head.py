"""The chunked LM-head logprobs equal log_softmax of full logits, values and gradients."""

import pytest
import torch

import trainer.head
from trainer.head import head_logprobs, plain_logprobs


def _naive(hidden, weight, bias, targets, inv_temp):
    z = hidden @ weight.t()
    if bias is not None:
        z = z + bias
    z = z * inv_temp[:, None]
    logp = torch.log_softmax(z, -1)
    ent = -(logp.exp() * logp).sum(-1)
    return logp.gather(1, targets[:, None]).squeeze(1), ent


def _inputs(n=7, h=5, v=11, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    b = torch.randn(v, generator=g, requires_grad=True) if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    inv_temp = 1 / torch.tensor([1.0, 0.5, 2.0, 1.0, 0.7, 1.0, 1.3])[:n]
    return hidden, weight, b, targets, inv_temp


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk_elements", [11, 30, 1 << 22])  # one row a chunk, a ragged last chunk, one chunk
def test_values_and_gradients_match_full_log_softmax(monkeypatch, bias, chunk_elements):
    monkeypatch.setattr(trainer.head, "CHUNK_ELEMENTS", chunk_elements)
    hidden, weight, b, targets, inv_temp = _inputs(bias=bias)
    g_logp = torch.randn(7, generator=torch.Generator().manual_seed(1))
    g_ent = torch.randn(7, generator=torch.Generator().manual_seed(2))

    logp, ent = head_logprobs(hidden, weight, b, targets, inv_temp, entropy=True)
    ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
    got = [hidden.grad.clone(), weight.grad.clone()] + ([b.grad.clone()] if bias else [])
    for t in (hidden, weight, b):
        if t is not None:
            t.grad = None

    ref_logp, ref_ent = _naive(hidden, weight, b, targets, inv_temp)
    ((ref_logp * g_logp).sum() + (ref_ent * g_ent).sum()).backward()
    want = [hidden.grad, weight.grad] + ([b.grad] if bias else [])

    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, rtol=1e-5, atol=1e-5)


def test_by_hand_two_tokens():
    # logits [0, ln 3] for the one row: softmax [1/4, 3/4]; target 1 -> log(3/4); entropy of (1/4, 3/4).
    hidden = torch.tensor([[1.0]])
    weight = torch.tensor([[0.0], [torch.log(torch.tensor(3.0))]])
    logp, ent = head_logprobs(hidden, weight, None, torch.tensor([1]), entropy=True)
    assert logp.item() == pytest.approx(-0.287682, abs=1e-6)
    # entropy of (1/4, 3/4): 0.25 ln 4 + 0.75 ln(4/3) = 0.346574 + 0.215762 = 0.562335
    assert ent.item() == pytest.approx(0.562335, abs=1e-6)
    # temperature 2: logits 0, ln sqrt(3) -> p(1) = sqrt(3) / (1 + sqrt(3)) = 0.633975, ln = -0.455746
    half = torch.tensor([0.5])
    assert head_logprobs(hidden, weight, None, torch.tensor([1]), half)[0].item() == pytest.approx(-0.455746, abs=1e-6)
    # d logp / d logit_1 = 1 - 3/4; logit_1 = w_1 · h, so d/dh = 0.25 · ln 3.
    hidden.requires_grad_(True)
    head_logprobs(hidden, weight, None, torch.tensor([1]))[0].sum().backward()
    assert hidden.grad.item() == pytest.approx(0.25 * 1.098612, abs=1e-6)


def test_without_entropy_returns_none_and_same_logprobs():
    hidden, weight, b, targets, inv_temp = _inputs()
    logp, ent = head_logprobs(hidden, weight, b, targets, inv_temp)
    assert ent is None
    torch.testing.assert_close(logp, _naive(hidden, weight, b, targets, inv_temp)[0], rtol=1e-5, atol=1e-5)


def test_bfloat16_autocast_runs_the_matmuls_in_bfloat16_and_returns_float32():
    hidden, weight, b, targets, inv_temp = _inputs(n=4, h=16, v=32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = head_logprobs(hidden, weight, b, targets, inv_temp[:4])
    assert logp.dtype == torch.float32
    ref = _naive(hidden.bfloat16().float(), weight.bfloat16().float(), None, targets, inv_temp[:4])[0]
    torch.testing.assert_close(logp, ref, rtol=2e-2, atol=2e-2)
    logp.sum().backward()
    assert hidden.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32


@pytest.mark.parametrize("chunk_elements", [64 * 3, 1 << 22])  # 3 rows a chunk (22 chunks, the last ragged), one chunk
def test_chunked_equals_plain_path_on_many_rows(monkeypatch, chunk_elements):
    # The acceptance check of the memory work: chunked logprobs, entropy and both gradients equal the
    # plain full-logits path (`plain_logprobs`, the benchmark's "unchunked" row) to 1e-5 in float32.
    monkeypatch.setattr(trainer.head, "CHUNK_ELEMENTS", chunk_elements)
    g = torch.Generator().manual_seed(3)
    n, h, v = 64, 16, 64
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    weight = (0.5 * torch.randn(v, h, generator=g)).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=g)
    inv_temp = 1 / (0.5 + torch.rand(n, generator=g))
    g_logp, g_ent = torch.randn(n, generator=g), torch.randn(n, generator=g)

    results = []
    for fn in (head_logprobs, plain_logprobs):
        hidden.grad = weight.grad = None
        logp, ent = fn(hidden, weight, None, targets, inv_temp, entropy=True)
        ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
        results.append([logp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
