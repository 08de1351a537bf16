"""Where and how a model runs: device selection, dtypes, CPU bfloat16 support, the allocator
setting and `from_pretrained` options shared by the engine and the trainer, and weight files.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from proxy.runtime.attention import register as grouped_attention

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DeviceUnavailable(RuntimeError):
    """The configured device is not on this machine."""


def select_device(device: str) -> torch.device:
    """cpu / cuda / npu; torch_npu is imported only when asked for (it breaks torch without Ascend)."""
    if device == "npu":
        import torch_npu  # noqa: F401

        if not torch.npu.is_available():  # type: ignore[attr-defined]
            raise DeviceUnavailable("device npu requested but no Ascend NPU is available")
        return torch.device("npu")
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("device cuda requested but CUDA is not available")
    return torch.device(device)


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX-512 BF16 or AMX). Without it torch
    emulates bfloat16 matmuls: on an AVX2-only EPYC a 32-sample training step took 154 s under
    bfloat16 autocast against a median of 11.5 s in float32 on the same machine (~13x)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: ask oneDNN (AVX-512 cores, Apple silicon)
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    flags = {word for line in cpuinfo.splitlines() if line.startswith("flags") for word in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def warn_if_emulated_bf16(device: torch.device, uses_bf16: bool, setting: str) -> None:
    if uses_bf16 and device.type == "cpu" and not cpu_has_native_bf16():
        log.warning(
            "%s asks for bfloat16 on a CPU without AVX-512 BF16 or AMX: torch emulates it, many times "
            "slower than float32 here; use float32 on this machine",
            setting,
        )


# glibc mallopt parameters (malloc.h) and the values keep_freed_memory sets.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MALLOPT = ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 256 << 20))


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the kernel.

    A CPU training step or decode step allocates and frees the same large activation and gradient
    tensors every time. With glibc's defaults each block over its adaptive mmap threshold, and
    the top of the heap past 128 KiB free, goes back to the kernel, so the next step pays a page
    fault (and the kernel's zeroing) for every 4 KiB it touches again: on the arithmetic task's
    training steps 3.6 M minor faults and 23 s of system time over a probe run, against 1.3 M
    and 10 s with blocks up to 32 MiB served from the heap and the heap kept (up to 1 GiB free
    at its top). The cost is a resident size that stays at its peak. Returns whether it applied
    (False off glibc).
    """
    mallopt = _glibc("mallopt")
    return mallopt is not None and all(mallopt(param, value) == 1 for param, value in _MALLOPT)


def release_freed_memory() -> bool:
    """Hand the memory malloc keeps free back to the kernel (glibc's `malloc_trim`); False off glibc.

    Freed blocks stay in malloc's heaps, split among live ones, whatever its thresholds: after a
    burst of 40 prompts of up to 400 tokens the embedded engine sat at 4.9 GB resident with
    nothing running, 1.9 GB after a trim (SmolLM2-135M, float32, lean forward). The engine calls
    this when it goes idle, so a server between bursts holds its working set, not its peak.
    """
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def _glibc(name: str) -> Any:
    """glibc's function `name` through ctypes, or None off glibc."""
    try:
        import ctypes

        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def model_load_options(device: torch.device) -> dict[str, Any]:
    """Prepare the process for a model on `device` and return the `from_pretrained` options for it.

    Everywhere: no Hub kernels. transformers 5 turns them on by default once the `kernels` package
    is installed (transformers itself requires it), and on CUDA `model.train()` then swaps layers
    for kernels fetched from the Hub: with `HF_HUB_OFFLINE=1` the trainer died at its first step
    ("Version 2 of 'kernels-community/rotary' is not available in the local cache", seen on an
    H200), and online the engine and the trainer would run different layer code than each other.
    On CPU (engine and trainer alike) also: freed memory is kept (`keep_freed_memory`) and
    attention is the grouped eager one, because CPU flash attention is slow at decode and training
    shapes (`proxy/engines/attention.py`).
    """
    options: dict[str, Any] = {"use_kernels": False}
    if device.type == "cpu":
        keep_freed_memory()
        options["attn_implementation"] = grouped_attention()
    return options


def load_weights_file(path: str) -> dict[str, torch.Tensor]:
    """Read safetensors weights from a file or a directory of shards."""
    from safetensors.torch import load_file

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"no safetensors weights at {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def check_fits(model: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    """Raise ValueError unless `state` has every tensor of the model (a tied lm_head aside) in its shape."""
    missing = [k for k in model if k not in state and not k.endswith("lm_head.weight")]
    unexpected = [k for k in state if k not in model]
    reshaped = [k for k in state if k in model and state[k].shape != model[k].shape]
    if missing or unexpected or reshaped:
        raise ValueError(
            f"weights do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}, "
            f"wrong shape {reshaped[:3]}"
        )
