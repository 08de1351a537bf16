"""Several trainer processes: torch.distributed with FSDP2 (`fully_shard`), one batch scattered.

Rank 0 alone claims from the store and broadcasts the step's samples; every rank trains the
prefix groups `split` gives it and the gradients are summed across ranks, weighted so that the
sum equals the one-process gradient of the whole batch (each rank's loss is normalised by its
own groups inside `train_step`; `ScaledReduceScatter` rescales it by local / global normaliser).

The step's passes (`group_logprobs`) run the decoder several times per microbatch and a
data-dependent number of times per step, and read the LM head's weight directly, so ranks do
not run the same sequence of module calls. FSDP's per-layer all-gathers and reduce-scatters
would then pair up wrongly across ranks. So parameters are gathered once before a step's passes
(`Sharded.gathered`), the passes run with no collective at all (gradients accumulate unsharded,
`set_requires_gradient_sync(False)`), and one identical one-token pass on every rank with
gradient sync on reduce-scatters every gradient (`Sharded.reduce_gradients`). Between steps
parameters, and always the optimizer state and gradients after the reduce, are sharded: the
memory of ZeRO-2 during the passes, of FSDP between them.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from trainer.batch import PrefixGroup
from trainer.config import TrainerConfig
from trainer.policy import Reference
from trainer.step import StepResult, normaliser_for, padded_cost, recompute_proximal, train_step

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
# How long a rank waits in a collective (a step's reduce, rank 0's next command while it pushes
# weights) before it gives up: a rank killed outright is otherwise noticed by the launcher.
COLLECTIVE_TIMEOUT_S = 1800.0


def check_supported(tcfg: TrainerConfig) -> None:
    """What several processes do not train yet, said before any model loads."""
    if tcfg.lora is not None:
        raise ValueError("trainer.processes > 1 does not train LoRA adapters yet: set trainer.processes = 1")
    if tcfg.dtype != "float32" or tcfg.optim.name != "adamw":
        raise ValueError(
            "trainer.processes > 1 needs trainer.dtype = 'float32' and trainer.optim.name = 'adamw' "
            "(the optimizer's state is sharded by parameter name; bfloat16 master weights and 8-bit "
            "state are not yet)"
        )


@dataclass(frozen=True)
class Rank:
    """This process's place in the trainer's process group (rank 0 of 1 without torch.distributed)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def from_env() -> Rank:
    """The rank the launcher gave this process (RANK, WORLD_SIZE, LOCAL_RANK, as torchrun sets them)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return Rank(rank, world, int(os.environ.get("LOCAL_RANK", str(rank))))


def rank_device(kind: str, rank: Rank) -> str:
    """Each rank's own accelerator (`cuda:1` for local rank 1); CPU ranks share the CPU."""
    return f"{kind}:{rank.local_rank}" if kind in ("cuda", "npu") and rank.distributed else kind


def init(rank: Rank, device: torch.device, timeout_s: float) -> None:
    """Join the process group (MASTER_ADDR / MASTER_PORT from the environment). A collective that
    waits longer than `timeout_s`, because a rank died, raises instead of hanging for ever."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "npu":
        torch.npu.set_device(device)  # type: ignore[attr-defined]
    dist.init_process_group(
        BACKENDS[device.type],
        rank=rank.rank,
        world_size=rank.world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast(obj: Any, rank: Rank) -> Any:
    """Rank 0's `obj` on every rank (pickled; a step's samples are small next to its passes)."""
    box = [obj if rank.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def split(groups: Sequence[PrefixGroup], world: int) -> list[list[PrefixGroup]]:
    """`groups` dealt to `world` ranks with about equal padded token cost (largest first, each to the
    rank with the least so far), each rank's share kept in its original order. A rank may get none
    when there are fewer groups than ranks; it still takes part in the step's collectives."""
    load = [0] * world
    owner: dict[int, int] = {}
    for i in sorted(range(len(groups)), key=lambda i: -padded_cost([groups[i]])):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += padded_cost([groups[i]])
    return [[g for i, g in enumerate(groups) if owner[i] == r] for r in range(world)]


class ScaledReduceScatter(ReduceScatter):
    """FSDP's gradient reduce-scatter as a sum of each rank's gradient times `scale`.

    `train_step` divides a rank's loss by its own groups' normaliser; scaling by local / global
    normaliser before summing gives the gradient of the whole batch over the global normaliser,
    exactly what one process computes. Gloo has no premultiplied sum, so the scale is applied here.
    """

    def __init__(self) -> None:
        self.scale = 1.0

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        if self.scale != 1.0:
            input_tensor.mul_(self.scale)
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return reduce_scatter(output_tensor, input_tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The repeated blocks FSDP shards one by one (Llama, Qwen, Mistral, ...: `model.model.layers`)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers to shard; multi-process training needs one")
    return list(layers)


class Sharded:
    """A model sharded across the process group, with the step's gather / reduce around its passes."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.comm = ScaledReduceScatter()
        for layer in decoder_layers(model):
            fully_shard(layer, reshard_after_forward=False)
        fully_shard(model, reshard_after_forward=False)  # embeddings, final norm, LM head (tied stays tied)
        self.units: list[FSDPModule] = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for unit in self.units:
            unit.set_reshard_after_backward(False)
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
            unit.set_custom_reduce_scatter(self.comm)
        model.set_requires_gradient_sync(False)
        # FSDP learns which module is the root from the first forward; the step never calls the
        # root's forward (it runs the decoder and the head itself), so one tiny pass does it here.
        device = next(p.device for p in model.parameters())
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device))
        self.reshard()

    def unshard(self) -> None:
        for unit in self.units:
            unit.unshard()

    def reshard(self) -> None:
        for unit in self.units:
            unit.reshard()

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Full parameters on every rank for the step's passes; sharded again afterwards."""
        self.unshard()
        try:
            yield
        finally:
            self.reshard()

    def reduce_gradients(self, scale: float) -> None:
        """Sum every rank's accumulated gradient times `scale` into the sharded gradients, then
        reshard (the optimizer steps the shards). One one-token pass, the same on every rank, with
        gradient sync on: its backward adds zeros and reduce-scatters each unit once."""
        model = self.model
        self.comm.scale = scale
        device = next(p.device for p in model.parameters())
        training = model.training
        model.eval()  # no dropout: the pass must not draw from the RNG one process would not
        model.set_requires_gradient_sync(True)
        try:
            with torch.enable_grad():
                logits = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device)).logits
                (logits.float().sum() * 0.0).backward()
        finally:
            model.set_requires_gradient_sync(False)
            model.train(training)
        self.reshard()


class ShardedOptimizer:
    """What `train_step` is given as its optimizer under FSDP: its `step` first reduces the ranks'
    gradients (`Sharded.reduce_gradients`), clips them by their global norm (`train_step`'s own
    clip sees one rank's unreduced gradients, so the caller turns it off), then steps the shards."""

    def __init__(self, inner: Any, sharded: Sharded, grad_clip: float) -> None:
        self.inner = inner
        self.sharded = sharded
        self.grad_clip = grad_clip if grad_clip > 0 else float("inf")
        self.scale = 1.0  # this rank's normaliser over the step's, set before each train_step
        self.grad_norm = 0.0  # the last step's global gradient norm, before clipping

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.sharded.reduce_gradients(self.scale)
        params = [p for p in self.sharded.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        self.grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        self.inner.step()


def shares(parts: Sequence[Sequence[PrefixGroup]], rank: Rank) -> list[list[PrefixGroup]]:
    """This rank's groups of each of a step's minibatches (the same `split` on every rank)."""
    return [split(part, rank.world)[rank.rank] for part in parts]


def recompute_proximal_sharded(
    sharded: Sharded, mine: list[PrefixGroup], device: torch.device, tokens_per_microbatch: int, autocast_bf16: bool
) -> None:
    """`recompute_proximal` over this rank's own groups, with the parameters gathered."""
    with sharded.gathered():
        recompute_proximal(sharded.model, mine, device, tokens_per_microbatch, autocast_bf16)


def train_step_sharded(
    optimizer: ShardedOptimizer,
    part: list[PrefixGroup],
    mine: list[PrefixGroup],
    cfg: TrainerConfig,
    device: torch.device,
    version: int,
    reference: Reference | None = None,
    keep_proximal: bool = False,
) -> StepResult:
    """`train_step` over this rank's groups `mine` of the minibatch `part`; the update equals one
    process's `train_step` over all of `part`, and so does the result every rank returns (losses
    and stats summed / token-weighted across ranks, the global gradient norm)."""
    total = normaliser_for(part, cfg.loss.agg)
    local = normaliser_for(mine, cfg.loss.agg) if mine else 0.0
    optimizer.scale = local / total if total else 0.0
    unclipped = cfg.model_copy(update={"optim": cfg.optim.model_copy(update={"grad_clip": 0.0})})
    sharded = optimizer.sharded
    with sharded.gathered():
        if mine:
            result = train_step(sharded.model, optimizer, mine, unclipped, device, version, reference, keep_proximal)
        else:  # nothing to train here, but the reduce is a collective every rank joins
            optimizer.zero_grad(set_to_none=True)
            optimizer.step()
            result = StepResult(loss=0.0, grad_norm=0.0, tokens=0, stats={})
    return _merged(result, optimizer.scale, optimizer.grad_norm)


def _merged(result: StepResult, scale: float, grad_norm: float) -> StepResult:
    """The step's result over every rank: each rank's loss is over its own normaliser, so it is
    weighted by `scale` like its gradient; stats are per-token means, weighted by tokens."""
    mine = (result.loss * scale, result.tokens, {k: v * result.tokens for k, v in result.stats.items()})
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    tokens = sum(t for _, t, _ in everyone)
    sums: dict[str, float] = {}
    for _, _, stats in everyone:
        for key, value in stats.items():
            sums[key] = sums.get(key, 0.0) + value
    return StepResult(
        loss=sum(loss for loss, _, _ in everyone),
        grad_norm=grad_norm,
        tokens=tokens,
        stats={k: v / max(tokens, 1) for k, v in sums.items()},
    )


@dataclass
class FullModel:
    """Gathered weights where a whole Hugging Face model is expected: `write_weights` reads a model's
    `config` and `state_dict()`, so a weight push and a checkpoint write these as they would the model."""

    config: Any
    state: dict[str, torch.Tensor]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state


def gather(model: Any, rank: Rank) -> FullModel | None:
    """`full_state_dict` with the model's config, on rank 0 (None elsewhere); every rank calls it."""
    state = full_state_dict(model, rank)
    return FullModel(model.config, state) if state is not None else None


def full_state_dict(model: Any, rank: Rank) -> dict[str, torch.Tensor] | None:
    """The whole model's state dict, gathered once into CPU memory on rank 0 (None elsewhere):
    what a weight push writes and a checkpoint's servable model holds. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if rank.is_main else None
