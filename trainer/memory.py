"""How much memory one forward/backward holds, estimated from the model's shape (`[trainer.memory]`).

A pass over prefix groups (`trainer.step.group_logprobs`) keeps, for the backward, each decoder
layer's activations at every token it runs: the norms' inputs and outputs (RMSNorm also keeps a
float32 copy), the q/k/v projections and their rotated copies, the attention output, and the MLP's
gate, up, activation and product. The continuation rows also keep their own keys and values over
prefix + continuation (the cache concatenated per layer). Under gradient checkpointing a layer
keeps only its input, and one layer's activations live again while it is replayed. The LM head
adds the hidden states of the target tokens and a chunk of logits (`trainer.head`).

`microbatch_budget(model, cfg)` turns `memory.microbatch_gb` into a test `trainer.step.microbatches`
packs under. The estimate counts activations only; weights, gradients and optimizer state are
fixed for a run (`static_bytes`). `benchmarks/trainer_memory.py` compares it with measured peaks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.batch import PrefixGroup
from trainer.config import TrainerConfig
from trainer.head import CHUNK_ELEMENTS

GIB = 1 << 30


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    act_bytes: int  # bytes of one activation element: 2 for bfloat16 weights or autocast, else 4

    @classmethod
    def of(cls, config: Any, bf16: bool) -> ModelShape:
        heads = config.num_attention_heads
        return cls(
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            intermediate=config.intermediate_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            vocab=config.vocab_size,
            act_bytes=2 if bf16 else 4,
        )

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def layer_token_bytes(self) -> int:
        """Bytes one decoder layer keeps per token for its backward (keys and values excluded)."""
        h, i, b = self.hidden, self.intermediate, self.act_bytes
        norms = 2 * (2 * h * b + h * 4)  # input, output and the float32 upcast of two RMSNorms
        attention = (2 * h + self.kv_width) * b + h * b + h * b  # q and rotated q, rotated k; SDPA output; o_proj in
        mlp = 4 * i * b  # gate, up, act(gate), act(gate) · up
        return norms + attention + mlp + h * b  # + the residual sum


def pass_bytes(shape: ModelShape, groups: list[PrefixGroup], checkpointing: bool) -> int:
    """Estimated activation bytes of one `group_logprobs` forward + backward over `groups`."""
    p = max(g.prefix.shape[0] for g in groups)
    o = max(g.continuation.shape[1] for g in groups)
    rows = sum(g.continuation.shape[0] for g in groups)
    targets = sum(int(g.loss_mask.sum()) for g in groups)
    kv = 2 * shape.kv_width * shape.act_bytes  # one token's keys and values in one layer
    per_layer = shape.layer_token_bytes()
    if checkpointing:  # full sequences: every layer keeps its input; one layer lives again at a time
        tokens = rows * (p + o)
        body = shape.layers * tokens * shape.hidden * shape.act_bytes + tokens * (per_layer + kv)
    else:  # the prefixes once, the continuations on their own copy of the prefix keys and values
        tokens = len(groups) * p + rows * o
        body = shape.layers * (tokens * per_layer + rows * (p + o) * kv)
    embeddings = 2 * tokens * shape.hidden * shape.act_bytes  # the lookup and the final norm's output
    chunk = min(targets, max(1, CHUNK_ELEMENTS // shape.vocab)) * shape.vocab
    head = targets * shape.hidden * 4 + 3 * chunk * 4  # target hidden states; a chunk's logits, exp and gradient
    return body + embeddings + head


def static_bytes(model: Any, optimizer_name: str = "adamw") -> int:
    """Bytes that stay for the run besides the weights: gradients, optimizer state and (bfloat16
    weights) the float32 masters."""
    total = 0
    for p in model.parameters():
        if not p.requires_grad:
            continue
        state = 2 * (1 if optimizer_name == "adamw_8bit" else 4)  # two moments
        master = 4 if p.dtype != torch.float32 else 0
        total += p.numel() * (p.element_size() + state + master)
    return total


def microbatch_budget(model: Any, cfg: TrainerConfig) -> Callable[[list[PrefixGroup]], bool] | None:
    """Whether a pass over some groups fits `memory.microbatch_gb`; None when the budget is 0 (tokens only)."""
    if not cfg.memory.microbatch_gb:
        return None
    bf16 = cfg.autocast_bf16 or next(model.parameters()).dtype == torch.bfloat16
    shape = ModelShape.of(model.config, bf16)
    limit = cfg.memory.microbatch_gb * GIB
    checkpointing = bool(getattr(model, "is_activation_checkpointing", False))
    return lambda groups: pass_bytes(shape, groups, checkpointing) <= limit
