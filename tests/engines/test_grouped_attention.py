"""The grouped attention gives transformers' eager attention's values and gradients."""

import copy

import pytest
import torch
from transformers.cache_utils import DynamicCache

from proxy.runtime import attention
from proxy.runtime.attention import register
from tests.conftest import tiny_llama
from tests.trainer.test_batch_step import RAGGED, SHARED
from trainer.batch import pack
from trainer.step import group_logprobs


def _pair():
    name = register()
    grouped = tiny_llama(attn_implementation=name).eval()
    eager = copy.deepcopy(grouped)
    eager.config._attn_implementation = "eager"
    assert grouped.config._attn_implementation == name
    return grouped, eager


@pytest.fixture(params=["grouped", "sdpa for few-row decode steps", "sdpa fallback"])
def path(request, monkeypatch):
    if request.param == "grouped":  # no forward goes to SDPA
        monkeypatch.setattr(attention, "DECODE_SDPA_ROWS", {})
    elif request.param == "sdpa for few-row decode steps":
        monkeypatch.setattr(attention, "DECODE_SDPA_ROWS", {torch.float32: 2})
    else:  # every forward over the score limit
        monkeypatch.setattr(attention, "MAX_SCORES", 0)
    return request.param


def test_padded_batch_forward_matches_eager(path):
    grouped, eager = _pair()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]])
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    out_g = grouped(input_ids=ids, attention_mask=mask).logits
    out_e = eager(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(out_g[0], out_e[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_g[1, :4], out_e[1, :4], rtol=1e-5, atol=1e-5)


def test_training_pass_logprobs_and_gradients_match_eager(path):
    grouped, eager = _pair()
    for samples in (RAGGED, SHARED):  # ragged prefixes; a common start run once
        groups = pack(samples, tokens_per_microbatch=1000, pad_id=0)
        lp_g, _ = group_logprobs(grouped, groups, torch.device("cpu"))
        lp_e, _ = group_logprobs(eager, groups, torch.device("cpu"))
        for a, b in zip(lp_g, lp_e):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        sum(lp.sum() for lp in lp_g).backward()
        sum(lp.sum() for lp in lp_e).backward()
        for (name, pa), (_, pb) in zip(grouped.named_parameters(), eager.named_parameters()):
            torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-5, msg=name)
            pa.grad = pb.grad = None


def test_left_padded_decode_steps_over_a_cache_match_eager(path):
    """The engine's decode: left-padded rows, one new token a step, position ids given."""
    grouped, eager = _pair()
    prompt = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 11, 12, 13]])
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    caches = [DynamicCache(), DynamicCache()]
    with torch.no_grad():
        firsts = [
            m(input_ids=prompt, attention_mask=mask, cache=c, use_cache=True) for m, c in zip((grouped, eager), caches)
        ]
        torch.testing.assert_close(firsts[0].logits[:, -1], firsts[1].logits[:, -1], rtol=1e-5, atol=1e-5)
        positions = mask.sum(1, keepdim=True)
        for token in (20, 21, 22):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
            ids = torch.full((2, 1), token)
            outs = [
                m(input_ids=ids, attention_mask=mask, position_ids=positions, cache=c, use_cache=True).logits
                for m, c in zip((grouped, eager), caches)
            ]
            torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
            positions = positions + 1


def test_few_row_bfloat16_decode_runs_in_float32_and_matches_float32_attention():
    """On CPU a bfloat16 decode step of a few rows goes to SDPA widened to float32: its output is
    float32 attention over the same (exactly widened) values, rounded once to bfloat16."""
    torch.manual_seed(0)
    rows, heads, kv_heads, keys, dim = 3, 6, 2, 40, 16
    query = torch.randn(rows, heads, 1, dim).bfloat16()
    key = torch.randn(rows, kv_heads, keys, dim).bfloat16()
    value = torch.randn(rows, kv_heads, keys, dim).bfloat16()
    mask = torch.zeros(rows, 1, 1, keys, dtype=torch.bfloat16)
    mask[1, ..., :7] = torch.finfo(torch.bfloat16).min  # a left-padded row
    assert rows <= attention.DECODE_SDPA_ROWS[torch.bfloat16]

    out, _ = attention.grouped_attention(_Eval, query, key, value, mask, dim**-0.5)

    expected, _ = attention.grouped_attention(_Eval, query.float(), key.float(), value.float(), mask.float(), dim**-0.5)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 1, heads, dim)
    torch.testing.assert_close(out, expected.bfloat16(), rtol=0, atol=0)
    # the padded row attends to its real keys only
    alone, _ = attention.grouped_attention(
        _Eval, query[1:2].float(), key[1:2, :, 7:].float(), value[1:2, :, 7:].float(), None, dim**-0.5
    )
    torch.testing.assert_close(out[1:2], alone.bfloat16(), rtol=0, atol=1e-2)


class _Eval:
    training = False


def test_a_bfloat16_decode_step_over_a_long_cache_stays_in_bfloat16(monkeypatch):
    """Over more than WIDEN_KEYS keys the copies cost more than they save: SDPA runs in bfloat16."""
    monkeypatch.setattr(attention, "WIDEN_KEYS", 16)
    torch.manual_seed(1)
    query = torch.randn(1, 4, 1, 8).bfloat16()
    key, value = torch.randn(1, 2, 40, 8).bfloat16(), torch.randn(1, 2, 40, 8).bfloat16()
    out, _ = attention.grouped_attention(_Eval, query, key, value, None, 8**-0.5)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=8**-0.5, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=0)
