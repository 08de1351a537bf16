"""Grouped-query attention for short, batched forwards on CPU: decode steps and training passes.

Both the embedded engine's decode steps (one new token per row over a ~100-token cache) and the
trainer's passes (answers of ~10 tokens over a ~100-token prefix) are many short rows. On CPU,
PyTorch's flash-attention kernel is slow at these shapes: ~60% of a 64-row decode step of
SmolLM2-135M and ~0.85 s of a ~5.8 s arithmetic training step (its backward). Transformers'
eager attention first repeats every key/value head for the query heads that share it (GQA),
whose backward is a reduction over a copy as large as the keys. This computes the eager
attention, softmax in float32, but folds a key/value head's query heads into one matmul,
(B, KVH, G·q, d) against (B, KVH, k, d), so nothing is repeated.

Its score matrix is materialised, so a forward whose scores would exceed `MAX_SCORES` elements
(long prompts, long training sequences) goes to PyTorch's memory-efficient SDPA kernel instead,
with the same additive mask. So does a decode step of a few rows (`DECODE_SDPA_ROWS`): there the
small matmuls and the softmax cost more than SDPA's fused kernel. On CPU that kernel runs in
float32 whatever the model's dtype (bfloat16 queries, keys and values are widened, exactly, and the
output rounded back): its bfloat16 path is fast only where the CPU has AMX. Two cores, one 9-head
query over 100-300 keys, a layer: on an AMD EPYC with AVX-512 BF16, bfloat16 SDPA 115-325 µs,
widened to float32 39-73, the grouped matmuls 120-170; with 8 rows 500-1,530, 114-269, 176-373.
On an Intel Xeon with AMX bfloat16 SDPA took ~35 µs and float32 ~30. In float32 SDPA falls behind
the grouped matmuls from ~4 rows, widened bfloat16 from ~16. Over long caches copying the keys and
values costs more than it saves, so a step over more than `WIDEN_KEYS` keys stays in bfloat16.

`register()` makes it available as `attn_implementation="areal_grouped"`, with transformers'
eager (additive float) mask.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

NAME = "areal_grouped"

# Largest score matrix (B·H·q·k elements, float32) computed eagerly: 16 MiB a layer.
MAX_SCORES = 1 << 22
# Decode steps (one query per row) of at most this many rows go to SDPA, by dtype.
DECODE_SDPA_ROWS = {torch.bfloat16: 8, torch.float32: 2}
# ... and on CPU over at most this many keys in float32: widening costs more than it saves from ~3,000
# keys (AMD EPYC, one row: 1,000 keys 805 µs bfloat16 against 195 widened; 4,000 keys 3.0 against 3.7 ms).
WIDEN_KEYS = 2048


def grouped_attention(
    module: Any,
    query: torch.Tensor,  # (B, H, q, d)
    key: torch.Tensor,  # (B, KVH, k, d)
    value: torch.Tensor,  # (B, KVH, k, d)
    attention_mask: torch.Tensor | None,  # (B, 1, q, k) additive, or None
    scaling: float,
    dropout: float = 0.0,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """Attention output (B, q, H, d), as transformers' attention functions return it."""
    b, heads, q, d = query.shape
    kv_heads, k = key.shape[1], key.shape[2]
    dropout = dropout if module.training else 0.0
    few_rows = q == 1 and b <= DECODE_SDPA_ROWS.get(query.dtype, 0)
    if b * heads * q * k > MAX_SCORES or few_rows:
        dtype = query.dtype
        if few_rows and k <= WIDEN_KEYS and query.device.type == "cpu" and dtype != torch.float32:
            query, key, value = query.float(), key.float(), value.float()
        mask = None if attention_mask is None else attention_mask.to(query.dtype)
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=heads != kv_heads
        )
        return out.transpose(1, 2).to(dtype).contiguous(), None
    groups = heads // kv_heads
    qg = query.reshape(b, kv_heads, groups * q, d)  # a KV head's query heads are consecutive
    scores = torch.matmul(qg, key.transpose(2, 3)) * scaling  # (B, KVH, G·q, k)
    if attention_mask is not None:
        scores = scores.view(b, kv_heads, groups, q, k) + attention_mask[:, :, None]
        scores = scores.view(b, kv_heads, groups * q, k)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout:
        weights = F.dropout(weights, p=dropout)
    out = torch.matmul(weights, value)  # (B, KVH, G·q, d)
    return out.view(b, heads, q, d).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the function and its mask with transformers; returns the implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, grouped_attention)
    AttentionMaskInterface.register(NAME, eager_mask)
    return NAME
