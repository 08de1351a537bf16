"""Weight sync: write the trainer's weights and tell the proxy to load them.

Weights go to `run_dir/weights/v{version}` as a Hugging Face directory (config +
safetensors), the format the embedded engine, SGLang's `update_weights_from_disk`
and vLLM's `reload_weights` all read. The proxy swaps them in between decode
steps and bumps its version; only the newest two directories are kept.

The folder is private: created 0700, and a folder another user owns is refused, since whoever
can write it chooses the weights every engine loads (the shared-memory root is per user).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import torch


def write_weights(model: Any, target: Path, dtype: torch.dtype | None = None) -> None:
    """config.json + model.safetensors (tied weights stored once), as from_pretrained reads them;
    floating-point tensors cast to `dtype` when given (the engine's: half the bytes to write and
    read for a bfloat16 engine, and the same values it would round to when loading)."""
    from safetensors.torch import save_file

    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.config.save_pretrained(tmp)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {
        name: _as(tensor.detach(), dtype).contiguous()
        for name, tensor in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def write_adapter(peft_model: Any, target: Path) -> None:
    """The adapter alone, as peft writes it (the engines' LoRA loaders read this), under `target`."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    peft_model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def _as(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


SHM_ROOT = Path(f"/dev/shm/areal-proxy-{os.getuid()}")


def private_dir(path: Path) -> Path:
    """`path` (and missing parents) as a folder only this user can read and write: created 0700,
    tightened to 0700 if we own it, refused if another user owns it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"{path} belongs to uid {info.st_uid}, not to this user ({os.getuid()}): weights written there "
            "could be replaced by its owner; set trainer.weights_dir to a folder of your own"
        )
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def default_weights_dir(run_dir: Path, local_engine: bool) -> Path:
    """Shared memory when the engine is on this machine (a push is a memory copy), else the run dir.

    The shared-memory folder is named after the run directory (stably, so a resumed trainer
    reuses it) and removed when the trainer exits: it lives in RAM until the machine reboots.
    """
    if local_engine and SHM_ROOT.parent.is_dir() and os.access(SHM_ROOT.parent, os.W_OK):
        resolved = run_dir.resolve()
        digest = hashlib.blake2b(str(resolved).encode(), digest_size=4).hexdigest()
        return SHM_ROOT / f"{resolved.name}-{digest}"
    return run_dir / "weights"


class WeightSync:
    def __init__(
        self,
        root: Path,
        proxy_url: str,
        admin_key: str = "",
        timeout_s: float = 600.0,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.root = root
        self.dtype = dtype
        self.proxy_url = proxy_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.timeout_s = timeout_s

    def engine_version(self) -> int:
        r = httpx.get(f"{self.proxy_url}/health", headers=self.headers, timeout=30)
        r.raise_for_status()
        return int(r.json()["version"])

    def push(self, policy: Any, version: int) -> float:
        """Save and load `version` of `policy` (a `trainer.policy.Policy`, or a bare model); returns the
        seconds it took. A LoRA policy pushes its adapter alone (adapter_config.json +
        adapter_model.safetensors), which each engine applies onto its base weights."""
        started = time.perf_counter()
        if SHM_ROOT.resolve() in self.root.resolve().parents:
            private_dir(SHM_ROOT)
        private_dir(self.root)
        target = self.root / f"v{version:07d}"
        adapter = bool(getattr(policy, "is_lora", False))
        if adapter:
            write_adapter(policy.peft_model, target)
        else:
            write_weights(getattr(policy, "model", policy), target, self.dtype)
        for attempt in range(5):
            try:
                r = httpx.post(
                    f"{self.proxy_url}/weights",
                    json={"path": str(target.resolve()), "version": version, "adapter": adapter},
                    headers=self.headers,
                    timeout=self.timeout_s,
                )
                if r.status_code < 500:
                    break
            except httpx.TransportError:
                if attempt == 4:
                    raise
            time.sleep(1 + attempt)
        if r.status_code != 200:
            raise RuntimeError(f"the proxy refused weights v{version}: {r.status_code} {r.text}")
        for old in sorted(p for p in self.root.iterdir() if p.name.startswith("v"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        return time.perf_counter() - started

    def discard(self) -> None:
        """Free the pushed weights held in shared memory (the engine has loaded them already)."""
        if SHM_ROOT.resolve() in self.root.resolve().parents:
            shutil.rmtree(self.root, ignore_errors=True)
