"""The trained policy: the model as the trainer holds it, its optimizer, and its reference.

`Policy.build` loads the model (from the base, or a checkpoint to resume), wraps it in LoRA
adapters when `[trainer.lora]` is present, turns on gradient checkpointing, and builds the
optimizer over the weights that train. Everything downstream (the step, checkpoints, weight
pushes) goes through it, so what a "weight" is (every parameter, or the adapters alone) is
decided here once:

- `model` is the Hugging Face model the step runs (`group_logprobs` calls its decoder and LM
  head); with LoRA it is the base model with the adapter layers injected, so the step's code
  is the same either way.
- `reference` gives the KL penalty's (or DPO's) reference logprobs: a frozen copy of the base, or
  with LoRA the same model with its adapters switched off (no second copy of the weights).
- `save_model(dir)` writes what a checkpoint holds; `push_payload(dir)` what a weight push
  sends (the adapter alone with LoRA).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.config import LoraConfig, TrainerConfig

log = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"
"""A LoRA checkpoint's adapter (adapter_config.json + adapter_model.safetensors), beside the merged model."""


@dataclass
class Reference:
    """The KL penalty's reference policy: `model` run inside `context()`."""

    model: Any
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    @contextlib.contextmanager
    def active(self) -> Iterator[Any]:
        with self.context():
            yield self.model


@dataclass
class Policy:
    model: Any  # the Hugging Face causal LM the step runs
    optimizer: torch.optim.Optimizer
    reference: Reference | None = None
    peft_model: Any = None  # the PeftModel wrapping `model` when training LoRA adapters
    lora: LoraConfig | None = None
    trainable: list[torch.nn.Parameter] = field(default_factory=list)

    @property
    def is_lora(self) -> bool:
        return self.peft_model is not None

    def save_model(self, target: Path) -> None:
        """What a checkpoint holds: the model (save_pretrained), or with LoRA the adapter under
        `adapter/` and, with `lora.save_merged`, the merged model beside it."""
        if not self.is_lora:
            self.model.save_pretrained(target, safe_serialization=True)
            return
        self.peft_model.save_pretrained(target / ADAPTER_DIR, safe_serialization=True)
        if self.lora is not None and self.lora.save_merged:
            merged_state_dict_save(self.peft_model, target)


def merged_state_dict_save(peft_model: Any, target: Path) -> None:
    """The base weights with the adapters merged in, saved as a Hugging Face model (config + safetensors)
    without touching the trained model's own weights."""
    from safetensors.torch import save_file

    base = peft_model.get_base_model()
    merged = merged_state_dict(peft_model)
    target.mkdir(parents=True, exist_ok=True)
    base.config.save_pretrained(target)
    tied = bool(getattr(base.config, "tie_word_embeddings", False))
    state = {k: v.contiguous() for k, v in merged.items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})


def merged_state_dict(peft_model: Any, adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """The base model's state dict (its own names) with every adapter's update merged into the weight
    it adapts, by the same `merge` the embedded engine applies to a pushed adapter."""
    from peft.tuners.lora import LoraLayer

    from proxy.runtime.adapters import Adapter, merge

    base = peft_model.get_base_model()
    adapter = Adapter()
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            key = f"{name}.weight"
            a, b = module.lora_A[adapter_name].weight.detach(), module.lora_B[adapter_name].weight.detach()
            adapter.pairs[key] = (a, b)
            adapter.scaling[key] = float(module.scaling[adapter_name])
    state = {
        name.replace(".base_layer.", "."): tensor.detach()
        for name, tensor in base.state_dict().items()
        if ".lora_" not in name and "lora_dropout" not in name
    }
    state.update(merge(state, adapter))
    return state


def build(
    cfg: Any, device: torch.device, base: str, resume: Path | None, shard: Callable[[Any], Any] | None = None
) -> Policy:
    """The policy for `[trainer]` on `device`: from `base`, or from checkpoint `resume` (whose adapter,
    with LoRA, goes back onto the base). `shard(model)`, with several trainer processes, replaces the
    model's parameters by their shards (`trainer/distributed.py`) before the optimizer is built over them."""
    from transformers import AutoModelForCausalLM

    from proxy.runtime.devices import model_load_options
    from trainer.optim import build_optimizer

    tcfg: TrainerConfig = cfg.trainer
    dtype = torch.bfloat16 if tcfg.dtype == "bfloat16" else torch.float32
    options = model_load_options(device)
    lora = tcfg.lora
    source = base if lora is not None or resume is None else resume
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **options).to(device)
    peft_model = None
    if lora is not None:
        peft_model = _with_adapters(model, lora, resume)
        model = peft_model.get_base_model()  # the same modules, adapters injected
    if tcfg.memory.gradient_checkpointing:  # `group_logprobs` then runs full sequences (no cache)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if shard is not None:
        shard(model)
    model.eval()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(trainable, tcfg.optim, device)
    reference = None
    if tcfg.loss.kl_coef > 0 or (tcfg.algorithm == "dpo" and tcfg.dpo.reference == "frozen"):
        if peft_model is not None:
            reference = Reference(model, peft_model.disable_adapter)
        else:
            ref = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, **options).to(device).eval()
            ref.requires_grad_(False)
            reference = Reference(ref)
    if peft_model is not None:
        total = sum(p.numel() for p in model.parameters())
        n = sum(p.numel() for p in trainable)
        log.info(
            "LoRA rank %d on %s: %d of %d parameters train (%.2f%%)",
            lora.rank,
            lora.target_modules,
            n,
            total,
            100.0 * n / max(total, 1),
        )
    return Policy(model, optimizer, reference, peft_model, lora, trainable)


def _with_adapters(model: Any, lora: LoraConfig, resume: Path | None) -> Any:
    import peft

    if resume is not None:
        if not (resume / ADAPTER_DIR / "adapter_config.json").is_file():
            raise ValueError(
                f"{resume} holds no LoRA adapter ({ADAPTER_DIR}/): it was written without [trainer.lora]; "
                "resume it without LoRA, or start a new run_dir"
            )
        return peft.PeftModel.from_pretrained(model, resume / ADAPTER_DIR, is_trainable=True)
    targets: str | list[str] = lora.target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)
