"""Checkpoints: model, optimizer, step, version and RNG state, written atomically.

A checkpoint is a directory `step_{N}` holding the model (save_pretrained), the
optimizer state, and `trainer_state.json`. It is written under a temporary name
and renamed, so a trainer killed mid-write leaves the previous checkpoint intact.
The two most recent checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch


@dataclass
class TrainerState:
    step: int = 0
    version: int = 0
    samples: int = 0
    sessions_trained: int = 0
    elapsed_s: float = 0.0  # the training loop's wall time, across resumes (trainer.max_minutes)


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(
    run_dir: Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    keep: int = 2,
    tokenizer: Any = None,
) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:07d}"
    tmp = root / f".tmp_step_{state.step:07d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:  # a checkpoint is a servable model: `areal-proxy serve --model <checkpoint>`
        tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "rng": _rng_state()}, tmp / "trainer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(asdict(state)))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(p for p in root.iterdir() if p.name.startswith("step_"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / "trainer_state.json").is_file())
    return done[-1] if done else None


def load_state(path: Path, optimizer: torch.optim.Optimizer) -> TrainerState:
    blob = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    _set_rng_state(blob["rng"])
    return TrainerState(**json.loads((path / "trainer_state.json").read_text()))
