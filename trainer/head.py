"""Token logprobs (and entropy) straight from hidden states, without an (N, V) logits tensor.

`head_logprobs(hidden, weight, bias, targets, inv_temp)` is log_softmax((h Wᵀ + b) · inv_temp) at
the targets, and optionally the entropy of that softmax, computed a few rows at a time. The
autograd graph keeps only the hidden states and each row's logsumexp; the backward recomputes
each chunk's logits and forms the gradient of both inputs from them:

  dL/dz = g_logp · (onehot(target) - p) - g_ent · p · (z - E_p[z])     (z = scaled logits)
  dL/dh = inv_temp · dL/dz · W,   dL/dW = Σ_rows inv_temp · dL/dzᵀ · h

The vocabulary-sized tensors of the plain path (the logits, their float32 copy, the softmax
saved for the backward, the gradient of each) cost far more than the matmuls on a CPU, where
every large fresh allocation is also paid in page faults: on the arithmetic task's 640 trained
tokens they were ~1.2 s of a ~3.8 s step. The same idea as Liger's fused linear cross entropy,
with a recompute instead of a gradient computed in the forward, because the policy loss needs
the logprobs before its gradient is known.
"""

from __future__ import annotations

from typing import Any

import torch

# Rows per chunk keep a chunk's float32 logits near 16 MB (85 rows of a 49,152-token vocabulary).
CHUNK_ELEMENTS = 1 << 22


def _chunk_rows(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // vocab)


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, inv_temp: torch.Tensor) -> torch.Tensor:
    z = (h @ weight.t()).float()  # (n, V)
    if bias is not None:
        z = z + bias.float()
    return z * inv_temp[:, None]


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden, weight, bias, targets, inv_temp, dtype, with_entropy):  # noqa: ANN001, ANN205
        h, w = hidden.to(dtype), weight.to(dtype)
        n, vocab = h.shape[0], w.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=h.device)
        ent = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=h.device)
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        step = _chunk_rows(vocab)
        for s in range(0, n, step):
            z = _logits(h[s : s + step], w, bias, inv_temp[s : s + step])
            lse[s : s + step] = torch.logsumexp(z, dim=-1)
            logp[s : s + step] = z.gather(1, targets[s : s + step, None]).squeeze(1) - lse[s : s + step]
            if with_entropy:
                p = torch.exp(z - lse[s : s + step, None])
                ent[s : s + step] = lse[s : s + step] - (p * z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, inv_temp, lse)
        ctx.dtype = dtype
        ctx.mark_non_differentiable(lse)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp, g_ent):  # noqa: ANN001, ANN205
        hidden, weight, bias, targets, inv_temp, lse = ctx.saved_tensors
        h, w = hidden.to(ctx.dtype), weight.to(ctx.dtype)
        n, vocab = h.shape[0], w.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dh = torch.empty_like(h) if need_h else None
        dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
        db = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if need_b else None
        use_ent = g_ent is not None and g_ent.numel() > 0 and bool(g_ent.any())
        step = _chunk_rows(vocab)
        for s in range(0, n, step):
            rows = slice(s, s + step)
            z = _logits(h[rows], w, bias, inv_temp[rows])
            p = torch.exp(z - lse[rows, None])
            dz = p * (-g_logp[rows, None])
            dz.scatter_add_(1, targets[rows, None], g_logp[rows, None])
            if use_ent:
                mean_z = (p * z).sum(-1, keepdim=True)
                dz -= g_ent[rows, None] * p * (z - mean_z)
            dz = dz * inv_temp[rows, None]
            if need_b:
                db += dz.sum(0)
            dz = dz.to(ctx.dtype)
            if need_h:
                dh[rows] = dz @ w
            if need_w:
                dw.addmm_(dz.t().float() if dz.dtype != torch.float32 else dz.t(), h[rows].float())
        dh = dh.to(hidden.dtype) if dh is not None else None
        dw = dw.to(weight.dtype) if dw is not None else None
        db = db.to(bias.dtype) if db is not None else None
        return dh, dw, db, None, None, None, None


def head_logprobs(
    hidden: torch.Tensor,  # (N, H) hidden states at the positions that predict `targets`
    weight: torch.Tensor,  # (V, H) the LM head (output embedding) weight
    bias: torch.Tensor | None,  # (V,) the LM head's bias, if it has one
    targets: torch.Tensor,  # (N,) long
    inv_temp: torch.Tensor | None = None,  # (N,) 1 / sampling temperature of each row; None: 1
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp (N,), entropy (N,) or None), float32: log softmax(h Wᵀ / T) at the targets, the
    matmuls in bfloat16 under CPU/CUDA bfloat16 autocast, else in the inputs' dtype."""
    if inv_temp is None:
        inv_temp = torch.ones(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    dtype = hidden.dtype
    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
    with torch.autocast(hidden.device.type, enabled=False):
        logp, ent = _HeadLogprobs.apply(hidden, weight, bias, targets, inv_temp.float(), dtype, entropy)
    return logp, (ent if entropy else None)


def plain_logprobs(
    hidden: torch.Tensor,  # (N, H)
    weight: torch.Tensor,  # (V, H)
    bias: torch.Tensor | None,  # (V,)
    targets: torch.Tensor,  # (N,) long
    inv_temp: torch.Tensor | None = None,  # (N,)
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`head_logprobs` the plain way, through the full (N, V) float32 logits and their log_softmax (which
    autograd keeps for the backward): the reference the chunked path is tested against, and the
    "unchunked" row of `benchmarks/trainer_memory.py`."""
    z = hidden @ weight.t()
    if bias is not None:
        z = z + bias
    z = z.float()
    if inv_temp is not None:
        z = z * inv_temp.float()[:, None]
    logp = torch.log_softmax(z, -1)  # (N, V)
    ent = -(logp.exp() * logp).sum(-1) if entropy else None
    return logp.gather(1, targets[:, None]).squeeze(1), ent
