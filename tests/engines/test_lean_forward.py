"""The engine's lean forward gives transformers' values, for decode rows and prefills in one pass."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM
from transformers.cache_utils import DynamicCache

from proxy.engines.base import SamplingParams, generate
from proxy.engines.config import EngineConfig
from proxy.engines.kv import BatchKV
from proxy.engines.lean import FastForward, Segment, can_pack
from proxy.engines.local import LocalEngine
from proxy.runtime.attention import register
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model
from tests.conftest import tiny_llama

TIGHT = {"rtol": 1e-5, "atol": 1e-5}


def tiny_qwen2() -> Qwen2ForCausalLM:
    """Qwen2's layout: biases on q, k and v only."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        use_sliding_window=False,
    )
    return Qwen2ForCausalLM(config)


MODELS = {
    "llama": lambda: tiny_llama(attn_implementation=register()),
    "llama with biases": lambda: tiny_llama(attn_implementation=register(), attention_bias=True, mlp_bias=True),
    "qwen2": lambda: tiny_qwen2(),
}


def _rows(model, prompts: list[list[int]]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per-sequence KV rows (1, H, l, D) from transformers' own prefill."""
    rows = []
    for prompt in prompts:
        cache = DynamicCache()
        model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        rows.append([(layer.keys, layer.values) for layer in cache.layers])
    return rows


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (1 - mask[:, None, None, :]).to(dtype) * torch.finfo(dtype).min


@pytest.mark.parametrize("name", list(MODELS))
@torch.inference_mode()
def test_decode_rows_and_a_prefill_in_one_pass_match_transformers(name):
    model = MODELS[name]().eval()
    assert FastForward.supports(model)
    lean = FastForward(model)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19]]  # left-padded to 7 in the batch
    ref, ours = BatchKV(), BatchKV()
    ref.add(_rows(model, prompts))
    ours.add(_rows(model, prompts), row_capacity=4)
    prefix, tails = [30, 31, 32, 33], torch.tensor([[40, 41, 42], [43, 44, 0]])  # right-padded tails
    cache = DynamicCache()
    model(input_ids=torch.tensor([prefix]), cache=cache, use_cache=True)
    past = [(layer.keys.expand(2, -1, -1, -1), layer.values.expand(2, -1, -1, -1)) for layer in cache.layers]
    for step, token in enumerate((20, 21, 22)):
        ids = torch.full((3, 1), token)
        mask, positions = ref.step_inputs()
        want = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=ref.cache, use_cache=True)
        ref.commit_step(mask)
        mask, positions = ours.step_inputs()
        segments = [
            Segment(ids=ids, positions=positions, mask=_additive(mask, torch.float32), layers=ours.cache.layers)
        ]
        if step == 1:
            segments.append(
                Segment(
                    ids=tails, positions=torch.arange(4, 7)[None].expand(2, -1), past=past, last=torch.tensor([2, 1])
                )
            )
        got = lean(segments)
        ours.commit_step(mask)
        torch.testing.assert_close(got[:3], want.logits[:, -1], **TIGHT)
        if step == 1:  # each tail on the prefix, as transformers runs it alone
            for row, length in ((0, 3), (1, 2)):
                full = torch.tensor([prefix + tails[row, :length].tolist()])
                plain = DynamicCache()
                logits = model(input_ids=full, cache=plain, use_cache=True).logits[0, -1]
                torch.testing.assert_close(got[3 + row], logits, **TIGHT)
                for (k, v), layer in zip(segments[1].kv, plain.layers):
                    torch.testing.assert_close(k[row : row + 1, :, : 4 + length], layer.keys, **TIGHT)
                    torch.testing.assert_close(v[row : row + 1, :, : 4 + length], layer.values, **TIGHT)
    for a, b in zip(ref.cache.layers, ours.cache.layers):
        torch.testing.assert_close(a.keys, b.keys, **TIGHT)


@torch.inference_mode()
def test_rows_put_in_place_decode_as_a_rebuilt_batch():
    """A finished row's slot and a new slot at the end take new sequences without a rebuild."""
    model = tiny_llama(attn_implementation=register()).eval()
    lean = FastForward(model)
    first, joining = [[5, 6, 7, 8, 9, 10], [12, 13, 14, 15]], [[20, 21, 22], [23, 24, 25, 26]]
    inplace = BatchKV()
    inplace.add(_rows(model, first), row_capacity=3)
    for layer in inplace.cache.layers:  # what a fresh slot may hold: not zeros
        layer._k[2:] = float("nan")
        layer._v[2:] = float("nan")
    mask, positions = inplace.step_inputs()
    lean(
        [
            Segment(
                ids=torch.tensor([[1], [2]]),
                positions=positions,
                mask=_additive(mask, torch.float32),
                layers=inplace.cache.layers,
            )
        ]
    )
    inplace.commit_step(mask)
    # row 0 finished: its slot and slot 2 take the joining sequences
    assert inplace.put(_rows(model, joining), [0, 2])
    rebuilt = BatchKV()
    survivor = [[12, 13, 14, 15, 2]]
    rebuilt.add(_rows(model, [joining[0], survivor[0], joining[1]]))
    ids = torch.tensor([[3], [4], [5]])
    outs = []
    for kv in (inplace, rebuilt):
        mask, positions = kv.step_inputs()
        outs.append(
            lean([Segment(ids=ids, positions=positions, mask=_additive(mask, torch.float32), layers=kv.cache.layers)])
        )
        kv.commit_step(mask)
    assert torch.isfinite(outs[0]).all()
    torch.testing.assert_close(outs[0], outs[1], **TIGHT)
    assert not inplace.put(_rows(model, [list(range(30, 50))]), [1]), "longer than the batch's width: rebuild"


def test_only_llama_family_models_with_full_attention_take_the_lean_path():
    assert FastForward.supports(tiny_llama())
    assert not FastForward.supports(tiny_llama(hidden_act="gelu"))
    sliding = Qwen2Config(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=97, use_sliding_window=True, sliding_window=16)  # fmt: skip
    assert not FastForward.supports(Qwen2ForCausalLM(sliding))
    assert not FastForward.supports(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=97)))


@pytest.mark.skipif(not can_pack(torch.bfloat16, torch.device("cpu")), reason="no native bfloat16 on this CPU")
@torch.inference_mode()
def test_packed_bfloat16_is_as_close_to_float32_as_transformers_bfloat16():
    path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")
    exact = AutoModelForCausalLM.from_pretrained(path, attn_implementation=register()).eval()
    half = AutoModelForCausalLM.from_pretrained(path, attn_implementation=register(), dtype=torch.bfloat16).eval()
    lean = FastForward(half)
    assert lean.head.packed is not None
    ids = torch.randint(100, 20_000, (4, 24), generator=torch.Generator().manual_seed(0))
    ours = torch.stack(
        [
            lean([Segment(ids=ids, positions=torch.arange(24)[None].expand(4, -1), last=torch.full((4,), t))])
            for t in range(23)
        ],
        dim=1,
    )
    nxt = ids[:, 1:, None]
    want = torch.log_softmax(exact(input_ids=ids).logits[:, :-1].float(), -1).gather(-1, nxt)
    theirs = torch.log_softmax(half(input_ids=ids).logits[:, :-1].float(), -1).gather(-1, nxt)
    mine = torch.log_softmax(ours.float(), -1).gather(-1, nxt)
    assert (mine - want).abs().mean() < 1.5 * (theirs - want).abs().mean() + 1e-3


@pytest.mark.skipif(not can_pack(torch.float32, torch.device("cpu")), reason="float32 packing is for x86 CPUs")
@torch.inference_mode()
def test_packed_float32_gives_transformers_logprobs():
    path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=register()).eval()
    lean = FastForward(model)
    assert lean.head.packed is not None and lean.head.weight is None, "packed, and kept only packed"
    ids = torch.randint(100, 20_000, (3, 20), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(20)[None].expand(3, -1)
    ours = torch.stack([lean([Segment(ids=ids, positions=positions, last=torch.full((3,), t))]) for t in range(20)], 1)
    theirs = model(input_ids=ids).logits
    torch.testing.assert_close(torch.log_softmax(ours, -1), torch.log_softmax(theirs, -1), atol=2e-4, rtol=1e-4)


def test_the_engine_answers_the_same_with_and_without_the_lean_path():
    """Greedy answers of requests arriving while others decode: the fused steps change no token."""

    async def answers(fast_path: str) -> list:
        engine = LocalEngine(EngineConfig(fast_path=fast_path, max_batch_size=4))
        await engine.start()
        try:
            assert (engine._fast is not None) == (fast_path == "auto")
            params = SamplingParams(max_new_tokens=10, temperature=0.0)
            prompts = [[1, 4093, 198, 30, 31, 32 + i, 2, 198, 1, 520, 9531, 198][: 8 + i % 4] for i in range(7)]

            async def one(i: int):
                await asyncio.sleep(0.05 * i)  # join a batch that is already decoding
                return await generate(engine, prompts[i], params, request_id=str(i))

            return await asyncio.gather(*(one(i) for i in range(7)))
        finally:
            await engine.stop()

    lean, plain = asyncio.run(answers("auto")), asyncio.run(answers("off"))
    for a, b in zip(lean, plain):
        assert a.output_ids == b.output_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-3


@torch.inference_mode()
def test_the_batch_makes_room_for_rows_as_it_grows_not_for_its_whole_capacity():
    """A lone long sequence must not hold keys/values for every row the batch could have."""
    model = tiny_llama(attn_implementation=register()).eval()
    kv = BatchKV()
    kv.add(_rows(model, [[5, 6, 7, 8]]), row_capacity=64)
    assert {layer._k.shape[0] for layer in kv.cache.layers} == {2}
    assert kv.put(_rows(model, [[9, 10]]), [1]), "a second row joins in place"
    assert not kv.put(_rows(model, [[11, 12]]), [2]), "a third row outgrows the room: rebuild"
    kv.add(_rows(model, [[11, 12]]), row_capacity=64)
    assert {layer._k.shape[0] for layer in kv.cache.layers} == {6}
    kv.add(_rows(model, [[13, 14]] * 40), row_capacity=64)
    assert {layer._k.shape[0] for layer in kv.cache.layers} == {64}, "never more than row_capacity"
