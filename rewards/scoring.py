"""Calling a reward function safely: off the event loop, with a timeout, checked.

A sync reward runs in a worker thread, an async one is awaited; both are bounded
by `[rewards] timeout_s`. Anything but a finite float (or a mapping of completion
ids to finite floats) is an error. Errors are returned, not raised, so the caller
records the session as failed with the reason — never as a silent 0.0. A sync
function that overruns its timeout cannot be killed; its thread is abandoned and
its result ignored.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real

from rewards.registry import RewardFn, is_async
from rewards.session import SessionView


@dataclass(frozen=True)
class Score:
    total: float | None  # the episode's reward (sum of per-turn rewards for a mapping)
    per_completion: dict[str, float] | None  # completion id -> reward, for per-turn rewards
    error: str | None = None


def _check_float(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{what} must be a float, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} is {value}, not a finite number")
    return value


def validate(value: object, completion_ids: set[str]) -> Score:
    if isinstance(value, Mapping):
        per = {}
        for key, v in value.items():
            if key not in completion_ids:
                raise KeyError(f"reward names completion {key!r}, which is not in this session")
            per[str(key)] = _check_float(v, f"reward for {key}")
        return Score(total=sum(per.values()), per_completion=per)
    return Score(total=_check_float(value, "reward"), per_completion=None)


async def score(fn: RewardFn, view: SessionView, timeout_s: float) -> Score:
    name = getattr(fn, "__name__", "reward")
    try:
        if is_async(fn):
            value = await asyncio.wait_for(fn(view), timeout_s)
        else:
            value = await asyncio.wait_for(asyncio.to_thread(fn, view), timeout_s)
        return validate(value, {c.id for c in view.completions})
    except TimeoutError:
        return Score(None, None, f"reward {name} timed out after {timeout_s:g}s")
    except Exception as exc:  # user code: any failure is recorded on the session
        return Score(None, None, f"reward {name} failed: {type(exc).__name__}: {exc}")
