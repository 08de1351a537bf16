"""The optimizer over the weights that train (`[trainer.optim]`).

AdamW with float32 state, or AdamW with 8-bit state (torchao's `AdamW8bit`, the `lowmem` extra).
When the trained weights are bfloat16, `MasterWeights` wraps either: the optimizer updates a
float32 master copy of each weight, and the bfloat16 weight the model runs is that copy rounded.
Without it an update smaller than half a bfloat16 ulp (2⁻⁸ of the weight: lr 1e-5 against a
weight of 0.01 already is one) rounds back to the old weight and training silently stalls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainer.config import OptimConfig


class MasterWeights:
    """An optimizer over float32 copies of bfloat16 `params`: `step` casts each weight's gradient to
    float32 onto its master, steps `inner` on the masters, and copies them back rounded to bfloat16.
    Quacks like a torch optimizer where the trainer touches one (`param_groups`, whose "lr" the
    schedule sets; `zero_grad`, `step`, `state_dict`, `load_state_dict`)."""

    def __init__(self, params: list[torch.nn.Parameter], make_inner: Callable[[list[torch.Tensor]], Any]) -> None:
        self.params = list(params)
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.inner = make_inner(self.masters)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        for m in self.masters:
            m.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for p, m in zip(self.params, self.masters):
            p.copy_(m)  # round to nearest
            m.grad = None

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state and the masters: tensors and plain values (`weights_only` loads it)."""
        return {"inner": self.inner.state_dict(), "masters": [m.detach() for m in self.masters]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        for p, m, saved in zip(self.params, self.masters, state["masters"], strict=True):
            m.copy_(saved)
            p.copy_(m)


def build_optimizer(params: list[torch.nn.Parameter], o: OptimConfig, device: torch.device) -> Any:
    """`o.name`'s optimizer over `params`, through float32 masters (`MasterWeights`) when they are bfloat16."""

    def make(tensors: list[torch.Tensor]) -> Any:
        return OPTIMIZERS[o.name](tensors, o, device)

    if any(p.dtype in (torch.bfloat16, torch.float16) for p in params):
        return MasterWeights(params, make)
    return make(params)


def _adamw(params: list[torch.Tensor], o: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """The fused kernel updates every tensor in one pass (on 2 CPU cores: 0.05 s a step for the 135M
    model instead of 0.4 s); torch has it for CPU and CUDA, not for NPU."""
    fused: Any = True if device.type in ("cpu", "cuda") else None
    return torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, fused=fused)


def _adamw_8bit(params: list[torch.Tensor], o: OptimConfig, device: torch.device) -> Any:
    """torchao's AdamW8bit: both moments blockwise-quantised to 8 bits (a quarter of AdamW's state)."""
    try:
        from torchao.optim import AdamW8bit
    except ImportError as e:
        raise ImportError('[trainer.optim] name = "adamw_8bit" needs torchao: pip install "areal-proxy[lowmem]"') from e
    return AdamW8bit(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)


OPTIMIZERS: dict[str, Callable[[list[torch.Tensor], OptimConfig, torch.device], Any]] = {
    "adamw": _adamw,
    "adamw_8bit": _adamw_8bit,
}
