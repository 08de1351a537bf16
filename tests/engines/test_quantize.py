"""`engine.quantize = "int4"`: the lean forward computes with 4-bit weights, whatever the step's size,
and the engine's logprobs are those of the dequantized model."""

from __future__ import annotations

import asyncio
import copy

import pydantic
import pytest
import torch
from transformers import AutoModelForCausalLM

from proxy.engines.base import SamplingParams, generate
from proxy.engines.config import EngineConfig
from proxy.engines.lean import GROUP, INT4_ROWS, FastForward, Segment, _Int4Linear, quantize_int4
from proxy.engines.local import LocalEngine
from proxy.render import Renderer
from proxy.runtime.attention import register
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model
from tests.conftest import tiny_llama

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"), reason="no CPU int4 kernel in this torch"
)


def dequantized(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose linear layers (lm head included) hold their int4-dequantized weights."""
    out = copy.deepcopy(model)
    if out.lm_head.weight is out.model.embed_tokens.weight:  # tied: the embedding keeps its own weights
        out.lm_head.weight = torch.nn.Parameter(out.lm_head.weight.detach().clone())
    with torch.no_grad():
        for module in out.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(quantize_int4(module.weight)[2])
    return out


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_quantization_is_q4_1s_grid_and_the_kernel_multiplies_by_it():
    torch.manual_seed(0)
    weight = torch.randn(96, 4 * GROUP)
    q, scale_zero, deq = quantize_int4(weight)
    assert q.dtype == torch.int32 and int(q.min()) >= 0 and int(q.max()) <= 15
    assert scale_zero.shape == (4, 96, 2) and deq.dtype == torch.bfloat16
    scale = scale_zero[..., 0].float().T.repeat_interleave(GROUP, 1)  # (96, K)
    assert ((deq.float() - weight).abs() <= scale * 0.51 + 1e-2).all(), "each weight within half a step"
    x = torch.randn(3, 4 * GROUP).bfloat16()
    linear = _Int4Linear(weight, torch.randn(96), pack=False)
    want = x.float() @ deq.float().T + linear.bias.float()
    assert relative(linear(x), want) < 1e-2  # the 4-bit kernel (3 rows)
    many = torch.randn(INT4_ROWS + 4, 4 * GROUP).bfloat16()
    assert relative(linear(many), many.float() @ deq.float().T + linear.bias.float()) < 1e-2  # the bf16 copy


@torch.inference_mode()
def test_small_and_large_steps_compute_the_dequantized_model():
    model = tiny_llama(attn_implementation=register(), attention_bias=True, vocab_size=96).to(torch.bfloat16).eval()
    lean = FastForward(model, quantize="int4")
    assert isinstance(lean.layers[0]["qkv"], _Int4Linear) and isinstance(lean.head, _Int4Linear)
    reference = dequantized(model).float()
    plain = copy.deepcopy(model).float()
    for rows, length in ((1, 5), (2, 12)):  # 5 tokens: the 4-bit kernel; 24: the bfloat16 copy
        assert (rows * length <= INT4_ROWS) == (length == 5)
        ids = torch.randint(3, 96, (rows, length), generator=torch.Generator().manual_seed(length))
        got = torch.stack(
            [
                lean(
                    [
                        Segment(
                            ids=ids, positions=torch.arange(length)[None].expand(rows, -1), last=torch.full((rows,), t)
                        )
                    ]
                )
                for t in range(length)
            ],
            dim=1,
        )
        want = reference(input_ids=ids).logits
        assert relative(got, want) < 0.03
        # the test can tell: the unquantized model is much further away
        assert relative(plain(input_ids=ids).logits, want) > 5 * relative(got, want)


def test_quantize_is_refused_where_it_does_not_apply():
    EngineConfig(dtype="bfloat16", quantize="int4")
    for bad in ({"dtype": "float32"}, {"dtype": "auto"}, {"dtype": "bfloat16", "fast_path": "off"}):
        with pytest.raises(pydantic.ValidationError, match="engine.quantize"):
            EngineConfig(quantize="int4", **bad)


def test_the_engines_logprobs_are_the_quantized_models():
    """Greedy tokens of the int4 engine, and their logprobs, as the dequantized model gives them."""
    path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")

    async def run() -> tuple[list[int], list[int], list[float]]:
        engine = LocalEngine(EngineConfig(dtype="bfloat16", quantize="int4"))
        await engine.start()
        try:
            assert isinstance(engine._fast.head, _Int4Linear)
            renderer = Renderer(engine.tokenizer, engine.info.eos_token_ids)
            prompt = renderer.prompt([{"role": "user", "content": "Name three rivers in Europe."}], None, None).ids
            out = await generate(engine, prompt, SamplingParams(max_new_tokens=12, temperature=0.0), request_id="q")
            return prompt, out.output_ids, out.logprobs
        finally:
            await engine.stop()

    prompt, output, logprobs = asyncio.run(run())
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=register(), dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        reference = dequantized(model).float()
        logits = reference(input_ids=torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
        want = torch.log_softmax(logits, -1)
        plain = torch.log_softmax(
            model.float()(input_ids=torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1], -1
        )
    ids = torch.tensor(output)
    chosen = want.gather(-1, ids[:, None]).squeeze(-1)
    assert (chosen >= want.max(-1).values - 0.1).all(), "greedy (up to bfloat16's noise) under that model"
    mine = (torch.tensor(logprobs) - chosen).abs().mean()
    theirs = (plain.gather(-1, ids[:, None]).squeeze(-1) - chosen).abs().mean()
    assert mine < 0.6 * theirs, (mine, theirs)  # closer to the quantized model than the unquantized one is
