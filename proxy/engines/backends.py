"""Backend name → engine class: the one place `engine.backend` is resolved.

Each entry imports its engine on first use, so a remote backend never imports torch (the
local engine's dependency) and importing this module stays light. The names are the ones
`EngineConfig.backend` allows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.engines.base import Engine
    from proxy.engines.config import EngineConfig

    EngineClass = Callable[[EngineConfig], Engine]


def _local() -> EngineClass:
    from proxy.engines.local import LocalEngine

    return LocalEngine


def _sglang() -> EngineClass:
    from proxy.engines.sglang import SGLangEngine

    return SGLangEngine


def _vllm() -> EngineClass:
    from proxy.engines.vllm import VLLMEngine

    return VLLMEngine


BACKENDS: dict[str, Callable[[], EngineClass]] = {"local": _local, "sglang": _sglang, "vllm": _vllm}
"""`engine.backend` → a function importing and returning its engine class."""


def make_engine(cfg: EngineConfig) -> Engine:
    """The engine `cfg.backend` names, built from `cfg` (not started)."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"engine.backend {cfg.backend!r} is not one of {', '.join(BACKENDS)}")
    return BACKENDS[cfg.backend]()(cfg)
