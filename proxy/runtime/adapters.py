"""LoRA adapters as the trainer pushes them: read a peft adapter folder and merge it into weights.

A LoRA trainer pushes only its adapter (`adapter_config.json` + `adapter_model.safetensors`, the
folder peft's `save_pretrained` writes and SGLang's and vLLM's LoRA loaders read). The embedded
engine merges it: each adapted weight becomes W₀ + s·B·A with s = alpha / rank (alpha / √rank
with rsLoRA), computed in float32 from the base weights W₀ it kept when the first adapter came,
so the hundredth push is as exact as the first (no drift from subtracting the previous update).

Why merged rather than an unmerged adapter beside each layer: decode on CPU is bound by reading
weights once per token, and an unmerged adapter adds two small matmuls, their launches and their
reads to every adapted layer on every decode step, and it would bypass the engine's fused fast
path. A merge costs one (out × rank) · (rank × in) product per adapted weight per push
(`benchmarks/lora_apply.py` measures both; docs/benchmarks.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / CONFIG).is_file()


@dataclass
class Adapter:
    """The (A, B) pair and scale of every adapted weight, keyed by the base model's weight name."""

    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    scaling: dict[str, float] = field(default_factory=dict)

    def delta(self, key: str) -> torch.Tensor:
        """s · B A for weight `key`, float32, shaped like the weight."""
        a, b = self.pairs[key]
        return (b.float() @ a.float()) * self.scaling[key]


def load_adapter(path: str | Path) -> Adapter:
    """Read a peft LoRA folder; ValueError naming what it holds that a merge cannot reproduce."""
    from safetensors.torch import load_file

    folder = Path(path)
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{folder / CONFIG} is not a readable adapter config: {exc}") from None
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"{folder} holds a {config.get('peft_type')} adapter; only LoRA adapters are merged")
    for key, why in (
        ("use_dora", "DoRA's magnitude vectors"),
        ("fan_in_fan_out", "transposed (Conv1D) weights"),
        ("modules_to_save", "fully trained modules"),
        ("rank_pattern", "per-layer ranks"),
        ("alpha_pattern", "per-layer alphas"),
    ):
        if config.get(key):
            raise ValueError(f"the adapter at {folder} uses {key} ({why}), which the embedded engine does not merge")
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    files = sorted(folder.glob("adapter_model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no adapter_model.safetensors in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    adapter = Adapter()
    for name, a in tensors.items():
        if ".lora_A." not in name:
            continue
        module = name.split(".lora_A.")[0].removeprefix(PEFT_PREFIX)
        b_name = name.replace(".lora_A.", ".lora_B.")
        if b_name not in tensors:
            raise ValueError(f"the adapter at {folder} has {name} without its {b_name}")
        adapter.pairs[f"{module}.weight"] = (a, tensors[b_name])
        adapter.scaling[f"{module}.weight"] = scale
    if not adapter.pairs:
        raise ValueError(f"the adapter at {folder} holds no lora_A/lora_B weights")
    return adapter


def merge(base: dict[str, torch.Tensor], adapter: Adapter) -> dict[str, torch.Tensor]:
    """The adapted weights W₀ + s·B A (in W₀'s dtype) from base weights `base` (only those adapted)."""
    missing = [k for k in adapter.pairs if k not in base]
    if missing:
        raise ValueError(f"the adapter adapts weights the model does not have: {missing[:3]}")
    out = {}
    for key in adapter.pairs:
        w = base[key]
        delta = adapter.delta(key).to(w.device)
        if delta.shape != w.shape:
            raise ValueError(f"the adapter's update of {key} is {tuple(delta.shape)}, the weight {tuple(w.shape)}")
        out[key] = (w.float() + delta).to(w.dtype)
    return out
