"""The `@reward` registry: name → scoring function.

A reward function takes a read-only `SessionView` of a finished episode and
returns a float, or a mapping completion id → float for per-turn rewards. It may
be sync (run in a worker thread, off the event loop) or async. Registering two
functions under one name raises at import time, so a typo in a user module can
never silently shadow a built-in.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rewards.session import SessionView

RewardValue = float | Mapping[str, float]
RewardFn = Callable[["SessionView"], RewardValue | Awaitable[RewardValue]]

REWARDS: dict[str, RewardFn] = {}


class DuplicateRewardError(ValueError):
    pass


def reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register `fn` under `name`: `@reward("gsm8k") def gsm8k(session) -> float`."""
    if not isinstance(name, str) or not name:
        raise ValueError("@reward needs a non-empty name")

    def register(fn: RewardFn) -> RewardFn:
        existing = REWARDS.get(name)
        if existing is not None and existing is not fn:
            where = f"{existing.__module__}.{existing.__qualname__}"
            raise DuplicateRewardError(f"reward {name!r} is already registered by {where}")
        REWARDS[name] = fn
        return fn

    return register


def get_reward(name: str) -> RewardFn:
    load_builtins()
    try:
        return REWARDS[name]
    except KeyError:
        known = ", ".join(sorted(REWARDS)) or "none"
        raise KeyError(f"unknown reward function {name!r} (registered: {known})") from None


def is_async(fn: RewardFn) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def load_builtins() -> None:
    importlib.import_module("rewards.builtins")


def load_modules(modules: list[str]) -> list[str]:
    """Import user reward modules (dotted names or .py paths); return what registered."""
    load_builtins()
    before = set(REWARDS)
    for spec in modules:
        if spec.endswith(".py") or "/" in spec:
            path = Path(spec).resolve()
            if not path.is_file():
                raise FileNotFoundError(f"reward module file {spec} not found")
            name = f"_areal_rewards_{path.stem}"
            if name in sys.modules:
                continue
            module_spec = importlib.util.spec_from_file_location(name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]  # a failed load must not look loaded on a retry
                raise
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            importlib.import_module(spec)
    return sorted(set(REWARDS) - before)
