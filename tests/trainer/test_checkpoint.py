"""Checkpoints: on disk before the rename, stale temporary folders removed, and loadable with
`weights_only=True` (no arbitrary pickles from a checkpoint folder)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from tests.conftest import tiny_llama
from trainer import checkpoint


def _save(tmp_path, step: int = 1):
    model = tiny_llama(num_hidden_layers=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    return model, optimizer, checkpoint.save(tmp_path, model, optimizer, checkpoint.TrainerState(step=step))


def test_every_file_and_the_folder_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    renamed: list[int] = []

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(src, dst) -> None:  # noqa: ANN001
        renamed.append(len(synced))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    _, _, final = _save(tmp_path)
    before_rename = synced[: renamed[0]]
    names = {os.path.basename(p) for p in before_rename}
    assert {"model.safetensors", "trainer.pt", "trainer_state.json", "config.json"} <= names
    assert any(os.path.basename(p).startswith(checkpoint.TMP_PREFIX) for p in before_rename), "the folder itself"
    assert synced[-1] == str(final.parent), "the rename, by fsyncing the checkpoints folder"


def test_stale_temporary_folders_are_removed(tmp_path):
    root = tmp_path / "checkpoints"
    stale = root / f"{checkpoint.TMP_PREFIX}0000003_99999"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    assert checkpoint.latest(tmp_path) is None
    assert not stale.exists(), "a trainer killed while saving left it"
    stale.mkdir()
    _save(tmp_path, step=4)
    assert not stale.exists()


def test_a_checkpoint_loads_weights_only_and_restores_the_rng(tmp_path):
    model, _, final = _save(tmp_path)
    after_save = np.random.rand(), torch.rand(1).item(), random.random()  # the draws the saved state leads to
    torch.load(final / "trainer.pt", weights_only=True)  # raises on any pickled object
    state = checkpoint.load_state(final, torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert state.step == 1
    assert (np.random.rand(), torch.rand(1).item(), random.random()) == after_save
