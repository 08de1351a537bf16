"""Grouped-query attention for the trainer's short, batched training forwards on CPU.

The trainer's passes are many short rows (an answer of ~10 tokens) over a ~100-token prefix
cache. On CPU, PyTorch's flash-attention backward is slow at these shapes (on the arithmetic
task it was ~0.85 s of a ~5.8 s step), and transformers' eager attention first repeats every
key/value head for the query heads that share it (GQA), whose backward is a reduction over a
copy as large as the keys. This computes the same attention as the eager one, softmax in
float32, but folds a key/value head's query heads into one matmul, (B, KVH, G·q, d) against
(B, KVH, k, d), so nothing is repeated.

`register()` makes it available as `attn_implementation="areal_grouped"`, with transformers'
eager (additive float) mask.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "areal_grouped"


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
    groups = heads // kv_heads
    qg = query.reshape(b, kv_heads, groups * q, d)  # a KV head's query heads are consecutive
    scores = torch.matmul(qg, key.transpose(2, 3)) * scaling  # (B, KVH, G·q, k)
    if attention_mask is not None:
        scores = scores.view(b, kv_heads, groups, q, k) + attention_mask[:, :, None]
        scores = scores.view(b, kv_heads, groups * q, k)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout and module.training:
        weights = torch.nn.functional.dropout(weights, p=dropout)
    out = torch.matmul(weights, value)  # (B, KVH, G·q, d)
    return out.view(b, heads, q, d).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the function and its mask with transformers; returns the implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, grouped_attention)
    AttentionMaskInterface.register(NAME, eager_mask)
    return NAME
