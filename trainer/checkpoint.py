"""Checkpoints: model, optimizer, step, version and RNG state, written atomically.

A checkpoint is a directory `step_{N}` holding the model (save_pretrained), the
optimizer state, and `trainer_state.json`. It is written under a temporary name, every
file and the folder fsynced, then renamed (and the rename fsynced), so a trainer killed
mid-write, or a machine that loses power, leaves the previous checkpoint intact;
temporary folders a killed trainer left behind are removed. The optimizer and RNG state
hold only tensors and plain values, so they load with `weights_only=True`. The two most
recent checkpoints are kept.
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

log = logging.getLogger(__name__)
TMP_PREFIX = ".tmp_step_"


@dataclass
class TrainerState:
    step: int = 0
    version: int = 0
    samples: int = 0
    sessions_trained: int = 0
    elapsed_s: float = 0.0  # the training loop's wall time, across resumes (trainer.max_minutes)


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
    torch.save({"optimizer": optimizer.state_dict(), "rng": _rng_state()}, tmp / "trainer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(asdict(state)))
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in sorted(p for p in root.iterdir() if p.name.startswith("step_"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    _remove_stale_tmp(root)  # a trainer killed while saving
    done = sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / "trainer_state.json").is_file())
    return done[-1] if done else None


def load_state(path: Path, optimizer: torch.optim.Optimizer) -> TrainerState:
    try:
        blob = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # written before the RNG state was stored as plain values
        log.warning("%s holds pickled numpy state; loading it with weights_only=False", path / "trainer.pt")
        blob = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    _set_rng_state(blob["rng"])
    return TrainerState(**json.loads((path / "trainer_state.json").read_text()))
