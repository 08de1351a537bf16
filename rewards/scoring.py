"""Calling a reward function safely: off the event loop, with a timeout, checked.

A sync reward runs on a thread of its own, at most `[rewards] max_workers` at once
(`RewardSlots`; a call waits for a free slot, the wait counting against its timeout),
an async one is awaited; both are bounded by `[rewards] timeout_s`. Anything but a
finite float (or a mapping of completion ids to finite floats) is an error. Errors are
returned, not raised, so the caller records the session as failed with the reason —
never as a silent 0.0. A sync function that overruns its timeout cannot be killed: its
daemon thread is abandoned and its result ignored, and it keeps its slot until it
returns, so stuck rewards bound the threads they hold instead of growing without end.
It must not sit in the event loop's shared executor, where a few stuck rewards would
starve the store's reads and block the server's shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real

from rewards.registry import RewardFn, RewardValue, is_async
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
                raise ValueError(f"reward names completion {key!r}, which is not in this session")
            per[str(key)] = _check_float(v, f"reward for {key}")
        return Score(total=sum(per.values()), per_completion=per)
    return Score(total=_check_float(value, "reward"), per_completion=None)


class RewardSlots:
    """How many sync reward functions may run at once; a slot is held until its function returns."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = asyncio.Semaphore(size)

    async def acquire(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._free.acquire(), timeout_s)
        except TimeoutError:
            return False
        return True

    def release(self) -> None:
        self._free.release()


def _on_own_thread(fn: RewardFn, view: SessionView, name: str, slots: RewardSlots) -> asyncio.Future:
    """Run a sync reward on a daemon thread holding a slot of `slots` (acquired by the caller) until
    it returns; its outcome settles the returned future."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: object, error: BaseException | None) -> None:
        if future.done():  # timed out and abandoned
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            outcome: tuple[object, BaseException | None] = (fn(view), None)
        except BaseException as exc:  # handed to the awaiting coroutine, which records it
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed while the reward ran
            loop.call_soon_threadsafe(settle, *outcome)
            loop.call_soon_threadsafe(slots.release)

    threading.Thread(target=run, name=f"reward-{name}", daemon=True).start()
    return future


async def score(
    fn: RewardFn, view: SessionView, timeout_s: float, slots: RewardSlots, name: str | None = None
) -> Score:
    """Score `view` with `fn`; `name` (the registered name) labels any error."""
    name = name or getattr(fn, "__name__", "reward")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        if is_async(fn):
            call = fn(view)
        elif await slots.acquire(timeout_s):
            call = _on_own_thread(fn, view, name, slots)
        else:
            return Score(
                None,
                None,
                f"reward {name} timed out after {timeout_s:g}s waiting for one of {slots.size} reward workers",
            )
        task = asyncio.ensure_future(call)
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
        if not done:
            task.cancel()
            return Score(None, None, f"reward {name} timed out after {timeout_s:g}s")
        value: RewardValue = task.result()
        return validate(value, {c.id for c in view.completions})
    except Exception as exc:  # user code: any failure is recorded on the session
        return Score(None, None, f"reward {name} failed: {type(exc).__name__}: {exc}")
