"""A lean forward of Llama-family models for the embedded engine: decode rows and prefills in one pass.

A decode step of a small model on CPU is bound by reading the weights, not by arithmetic: for
SmolLM2-135M in bfloat16 a 64-row step costs only twice an 8-row one. Transformers' forward adds
~60 small tensor operations per layer, and the engine ran each admission's prefill as a forward of
its own, so a step with new requests read every weight twice. Here one pass serves the step:
the tokens of every segment (the decode rows, one token each, and the prompt tails being
prefilled) go through each linear layer together, and only attention runs per segment, each
against its own keys/values. The projections that share an input are fused (q, k, v; gate, up),
and on CPU the weights are packed once for oneDNN (bfloat16 where the CPU computes it natively,
float32 on x86), which otherwise re-lays them out on every call; in float32 on 2 AVX2-only AMD
EPYC cores a packed LM head over 28 rows takes ~23 ms against ~45-58 ms for MKL's sgemm.

Values match transformers' forward for the same weights and dtype (tests compare logits and
keys/values). With `quantize="int4"` (`engine.quantize`) the linear layers' weights are quantized to
4 bits (`quantize_int4`) and the forward is that of the dequantized weights.
`FastForward.supports(model)` says which models take this path: Llama, Mistral and Qwen2 layouts
with SiLU gating and full attention; any other model keeps transformers'.
Call `refresh()` after loading new weights, so the fused and packed copies follow.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from proxy.runtime.attention import grouped_attention

MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass
class Segment:
    """Rows that attend to the same kind of past. `ids` (B, q): right-padded prompt tails, or one
    token per decode row. `positions` (B, q). `mask` additive (B or 1, 1, q, past + q), or None for
    plain causal attention over `past`. Keys/values come from `layers` (per layer an object whose
    `update(k, v)` appends and returns the whole keys/values: the decode batch's cache) or from
    `past` (per layer (keys, values), (B, kv_heads, p, dim), possibly expanded; the new keys/values
    are returned whole in `kv`). `last` (B,): the position of each row whose logits are wanted."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None = None
    layers: list[Any] | None = None
    past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    last: torch.Tensor | None = None
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # filled by the forward (prefill segments)


class _Linear:
    """y = x Wᵀ + b, with W packed for oneDNN when that is faster (`can_pack`); a packed W is
    kept only packed."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> None:
        self.bias = bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64) if pack else None
        self.weight = None if pack else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


GROUP = 32  # input columns sharing a 4-bit scale and zero (GGUF's Q4_1 block)
INT4_ROWS = 8  # a linear over at most this many tokens reads the 4-bit weights; a bigger one the bfloat16 copy


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights (N, K) to 4 bits, asymmetric in groups of `GROUP` input columns: w ≈ (q - 8)·scale + zero,
    q in 0..15 (the min/max layout of GGUF's Q4_1). Returns q (N, K) int32, scale and zero (K/GROUP,
    N, 2) bfloat16 as PyTorch's CPU int4 kernel takes them, and the dequantized weights (N, K)
    bfloat16: exactly the weights that kernel multiplies by (scale and zero rounded to bfloat16
    first, and q chosen against the rounded ones)."""
    n, k = weight.shape
    w = weight.float().view(n, k // GROUP, GROUP)
    low, high = w.amin(-1), w.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-8).bfloat16().float()
    zero = (low + 8 * scale).bfloat16().float()
    q = ((w - zero[..., None]) / scale[..., None] + 8).round().clamp(0, 15)
    dequantized = ((q - 8) * scale[..., None] + zero[..., None]).view(n, k).bfloat16()
    scale_zero = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().bfloat16()
    return q.view(n, k).to(torch.int32), scale_zero, dequantized


def can_quantize(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.shape[1] % GROUP == 0
        and weight.shape[0] % 16 == 0  # the kernel packs 16 output rows together
        and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
    )


class _Int4Linear:
    """y = x Wᵀ + b with W quantized to 4 bits (`quantize_int4`). A decode step of a few rows is bound
    by reading the weights, so linears over at most `INT4_ROWS` tokens use the 4-bit kernel (a
    quarter of bfloat16's bytes); the kernel falls behind oneDNN's from ~16 rows, so bigger ones use
    a bfloat16 copy of the same dequantized weights: every step computes with the same weights."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> None:
        q, self.scale_zero, dequantized = quantize_int4(weight)
        self.packed4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        self.bias = None if bias is None else bias.bfloat16()
        self.dense = _Linear(dequantized, self.bias, pack)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > INT4_ROWS:
            return self.dense(x)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed4, GROUP, self.scale_zero)
        return y if self.bias is None else y + self.bias


def _bias(*linears: torch.nn.Linear) -> torch.Tensor | None:
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat([lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in linears])


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """oneDNN packed linears: on CPU, in bfloat16 where oneDNN computes it natively, and in
    float32 on x86 (elsewhere, e.g. on ARM, oneDNN's float32 path is not known to beat the BLAS)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32 and platform.machine().lower() in ("x86_64", "amd64")


class FastForward:
    def __init__(self, model: Any, quantize: str = "none") -> None:
        self.model = model
        self.quantize = quantize
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.inter = cfg.intermediate_size
        self.layers: list[dict[str, Any]] = []
        self.refresh()

    @staticmethod
    def supports(model: Any) -> bool:
        cfg = getattr(model, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in MODEL_TYPES:
            return False
        if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
            return False
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
            return False
        inner = getattr(model, "model", None)
        return all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb"))

    def refresh(self) -> None:
        """Rebuild the fused (and packed, or quantized) weights from the model's parameters."""
        m = self.model.model
        weight = m.embed_tokens.weight
        pack = can_pack(weight.dtype, weight.device)
        with torch.no_grad():
            self.layers = []
            for layer in m.layers:
                a, mlp = layer.self_attn, layer.mlp
                self.layers.append(
                    {
                        "norm_in": (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                        "qkv": self._linear(
                            torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                            _bias(a.q_proj, a.k_proj, a.v_proj),
                            pack,
                        ),
                        "o": self._linear(a.o_proj.weight, a.o_proj.bias, pack),
                        "norm_post": (
                            layer.post_attention_layernorm.weight,
                            layer.post_attention_layernorm.variance_epsilon,
                        ),
                        "gate_up": self._linear(
                            torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                            _bias(mlp.gate_proj, mlp.up_proj),
                            pack,
                        ),
                        "down": self._linear(mlp.down_proj.weight, mlp.down_proj.bias, pack),
                    }
                )
            self.norm = (m.norm.weight, m.norm.variance_epsilon)
            head = self.model.lm_head
            self.head = self._linear(head.weight, head.bias, pack)

    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> _Linear | _Int4Linear:
        if self.quantize == "int4" and can_quantize(weight):
            return _Int4Linear(weight, bias, pack)
        return _Linear(weight, bias, pack)

    def __call__(self, segments: list[Segment]) -> torch.Tensor:
        """Logits (sum of rows, vocab) in segment order: each row's `last` position (all positions
        of a one-token row); prefill segments get their whole keys/values in `kv`."""
        m = self.model.model
        h = torch.cat([m.embed_tokens(s.ids).flatten(0, 1) for s in segments])  # (T, C)
        positions = torch.cat([s.positions.flatten() for s in segments])[None]  # (1, T)
        cos, sin = m.rotary_emb(h[None], positions)
        cos, sin = cos[0, :, None], sin[0, :, None]  # (T, 1, dim)
        spans = []
        start = 0
        for s in segments:
            spans.append((start, start + s.ids.numel()))
            start += s.ids.numel()
            s.kv = [] if s.layers is None else None
        for i, layer in enumerate(self.layers):
            x = _rms_norm(h, *layer["norm_in"])
            qkv = layer["qkv"](x).view(h.shape[0], self.heads + 2 * self.kv_heads, self.head_dim)
            qk = _rotate(qkv[:, : self.heads + self.kv_heads], cos, sin)
            v = qkv[:, self.heads + self.kv_heads :]
            outs = [self._attend(s, i, qk[a:b], v[a:b]) for s, (a, b) in zip(segments, spans)]
            h = h + layer["o"](torch.cat(outs))
            x = _rms_norm(h, *layer["norm_post"])
            gate_up = layer["gate_up"](x)
            h = h + layer["down"](F.silu(gate_up[:, : self.inter]) * gate_up[:, self.inter :])
        picks = []
        for s, (a, _) in zip(segments, spans):
            rows, q = s.ids.shape
            last = s.last if s.last is not None else torch.full((rows,), q - 1, device=h.device)
            picks.append(a + torch.arange(rows, device=h.device) * q + last.to(h.device))
        return self.head(_rms_norm(h[torch.cat(picks)], *self.norm))

    def _attend(self, s: Segment, layer: int, qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One segment's attention in one layer: (rows·q, heads·dim)."""
        rows, q = s.ids.shape
        qk = qk.view(rows, q, self.heads + self.kv_heads, self.head_dim).transpose(1, 2)
        query, key = qk[:, : self.heads], qk[:, self.heads :]
        value = v.view(rows, q, self.kv_heads, self.head_dim).transpose(1, 2)
        if s.layers is not None:
            key, value = s.layers[layer].update(key, value)
        else:
            if s.past is not None:
                past_k, past_v = s.past[layer]
                key, value = torch.cat([past_k, key], dim=2), torch.cat([past_v, value], dim=2)
            else:
                key, value = key.contiguous(), value.contiguous()
            s.kv.append((key, value))
        mask = s.mask if s.mask is not None else _causal(q, key.shape[2], query.dtype, query.device)
        out, _ = grouped_attention(_INFERENCE, query, key, value, mask, self.head_dim**-0.5)
        return out.reshape(rows * q, self.heads * self.head_dim)


class _Inference:
    training = False


_INFERENCE = _Inference()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As transformers' Llama RMSNorm: normalised in float32, cast back, then scaled."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (T, heads, dim) with cos/sin (T, 1, dim), as transformers' rotate_half."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _causal(q: int, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask (1, 1, q, k): query i (at key position k - q + i) sees keys up to its own."""
    allowed = torch.ones(q, k, dtype=torch.bool, device=device).tril(k - q)
    return torch.zeros(q, k, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]
