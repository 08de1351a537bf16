"""Checkpoints: model, optimizer, step, version and RNG state, written atomically.

A checkpoint is a directory `step_{N}` holding the model (save_pretrained), the
optimizer state, and `trainer_state.json`. It is written under a temporary name, every
file and the folder fsynced, then renamed (and the rename fsynced), so a trainer killed
mid-write, or a machine that loses power, leaves the previous checkpoint intact;
temporary folders a killed trainer left behind are removed. The optimizer and RNG state
hold only tensors and plain values, so they load with `weights_only=True`; they are the
biggest file, written past the page cache (`trainer/uncached.py`). The two most recent
checkpoints are kept.

Several trainer processes (`trainer/distributed.py`) write the same folder: the optimizer's
shards with torch.distributed.checkpoint under `optimizer/` (each rank its own file), rank 0
the whole model (gathered once, so the checkpoint stays servable) and the rest, then rank 0
renames it after every rank is done. Loading reshards: a checkpoint written by N processes
resumes in M, one process's `trainer.pt` optimizer included.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer import uncached

log = logging.getLogger(__name__)
TMP_PREFIX = ".tmp_step_"


@dataclass
class TrainerState:
    step: int = 0
    version: int = 0
    samples: int = 0
    sessions_trained: int = 0
    elapsed_s: float = 0.0  # the training loop's wall time, across resumes (trainer.max_minutes)
    baselines: dict | None = None  # [trainer.running_mean]'s means (trainer/selection.py RunningMeans)


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss]  # loadable weights-only
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    keys = keys.numpy().astype(np.uint32) if isinstance(keys, torch.Tensor) else keys
    np.random.set_state((kind, keys, pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])


def _fsync_tree(folder: Path) -> None:
    """Every file under `folder`, then the folder itself, on disk."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_tmp(root: Path, keep: Path | None = None) -> None:
    for path in root.glob(TMP_PREFIX + "*"):
        if path != keep:
            shutil.rmtree(path, ignore_errors=True)


def save(
    run_dir: Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    keep: int = 2,
    tokenizer: Any = None,
    write_model: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint `step_{state.step}`: the model by `write_model(folder)` when given (a LoRA
    policy's adapter and merged model, `trainer/policy.py`), else `model.save_pretrained`."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:07d}"
    tmp = root / f"{TMP_PREFIX}{state.step:07d}_{os.getpid()}"
    _remove_stale_tmp(root)
    if write_model is not None:
        write_model(tmp)
    else:
        model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:  # a checkpoint is a servable model: `areal-proxy serve --model <checkpoint>`
        tokenizer.save_pretrained(tmp)
    uncached.save({"optimizer": optimizer.state_dict(), "rng": _rng_state()}, tmp / "trainer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(asdict(state)))
    _publish(tmp, final, keep)
    return final


def _publish(tmp: Path, final: Path, keep: int) -> None:
    """Make the written folder `tmp` the checkpoint `final`: everything on disk, then the rename (and
    the rename itself on disk); only the newest `keep` checkpoints stay."""
    root = final.parent
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in sorted(p for p in root.iterdir() if p.name.startswith("step_"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


SHARDED_OPTIMIZER = "optimizer"


def save_sharded(
    run_dir: Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    full_model: Any,
    keep: int = 2,
    tokenizer: Any = None,
) -> Path:
    """Write checkpoint `step_{state.step}` from every rank of a sharded model; every rank calls it.
    `full_model` (rank 0 only; None elsewhere) has the gathered weights `write_weights` writes."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from trainer.weights import write_weights

    main = dist.get_rank() == 0
    root = run_dir / "checkpoints"
    final = root / f"step_{state.step:07d}"
    tmp = root / f"{TMP_PREFIX}{state.step:07d}_sharded"  # the same name on every rank
    if main:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_tmp(root)
        write_weights(full_model, tmp)  # config.json + model.safetensors: `areal-proxy serve --model`
    dist.barrier()
    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=tmp / SHARDED_OPTIMIZER)
    dist.barrier()  # every rank's shard is written
    if main:
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save({"rng": _rng_state()}, tmp / "trainer.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(asdict(state)))
        _publish(tmp, final, keep)
    dist.barrier()  # no rank goes on (or is killed for good) before the rename
    return final


def latest(run_dir: Path) -> Path | None:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    _remove_stale_tmp(root)  # a trainer killed while saving
    done = sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / "trainer_state.json").is_file())
    return done[-1] if done else None


def load_state(path: Path, optimizer: torch.optim.Optimizer, model: Any = None) -> TrainerState:
    """The optimizer and RNG state of checkpoint `path`, and its counters. With `model` (needed when
    the optimizer is over a sharded model, or the checkpoint was written by several processes) the
    optimizer state is matched to parameters by name, so any process count loads any checkpoint."""
    if (path / SHARDED_OPTIMIZER).is_dir():
        _load_sharded_optimizer(path / SHARDED_OPTIMIZER, model, optimizer)
        blob = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
    else:
        blob = _load_blob(path)
        if _is_sharded(model):
            _load_full_optimizer(blob["optimizer"], model, optimizer)
        else:
            optimizer.load_state_dict(blob["optimizer"])
    _set_rng_state(blob["rng"])
    return TrainerState(**json.loads((path / "trainer_state.json").read_text()))


def _is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _load_sharded_optimizer(folder: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """DCP reads into the shapes of this process's state (its own shards, or whole tensors)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    if model is None:
        raise ValueError(f"{folder.parent} was written by several trainer processes: load it with the model")
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # allocates the state to read into
    dcp.load(state, checkpoint_id=folder)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def _load_full_optimizer(saved: dict[str, Any], model: Any, optimizer: torch.optim.Optimizer) -> None:
    """One process's `optimizer.state_dict()` (state keyed by parameter index, in the order the
    optimizer was built over the trainable parameters) onto a sharded model's optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [name for name, p in model.named_parameters() if p.requires_grad]
    by_name = {
        "state": {names[i]: value for i, value in saved["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def _load_blob(path: Path) -> dict[str, Any]:
    try:
        blob = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # written before the RNG state was stored as plain values
        log.warning("%s holds pickled numpy state; loading it with weights_only=False", path / "trainer.pt")
        blob = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    return blob
