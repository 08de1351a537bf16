"""`score`: a reward call bounded by its timeout, checked, and its failures told apart."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from rewards.scoring import RewardSlots, Score, score, validate
from rewards.session import CompletionView, SessionView


def view(*ids: str) -> SessionView:
    completions = tuple(
        CompletionView(
            id=i, parent_id=None, messages=(), response={"content": "42"}, finish_reason="stop", created_at=0
        )
        for i in ids
    )
    return SessionView(
        session_id="s", task_id=None, group_id=None, reference="42", metadata={}, completions=completions
    )


def run(fn, timeout_s: float = 1.0, name: str | None = None, session: SessionView | None = None) -> Score:
    return asyncio.run(score(fn, session or view("c1"), timeout_s, RewardSlots(16), name=name))


def test_floats_and_mappings_are_checked():
    assert run(lambda s: 1) == Score(total=1.0, per_completion=None)
    assert run(lambda s: {"c1": 0.5, "c2": 2}, session=view("c1", "c2")) == Score(2.5, {"c1": 0.5, "c2": 2.0})
    for bad, message in [
        (True, "TypeError: reward must be a float, got bool"),
        ("1", "TypeError: reward must be a float, got str"),
        (None, "TypeError: reward must be a float, got NoneType"),
        (math.inf, "ValueError: reward is inf, not a finite number"),
        ({"c1": math.nan}, "ValueError: reward for c1 is nan, not a finite number"),
        ({"elsewhere": 1.0}, "ValueError: reward names completion 'elsewhere', which is not in this session"),
    ]:
        result = run(lambda s, bad=bad: bad, name="r")
        assert result.total is None and result.per_completion is None
        assert result.error == f"reward r failed: {message}"


def test_errors_name_the_registered_reward_not_the_python_function():
    def answer_format(session: SessionView) -> float:
        raise KeyError("answer_tags")

    assert run(answer_format, name="format").error == "reward format failed: KeyError: 'answer_tags'"
    assert run(answer_format).error == "reward answer_format failed: KeyError: 'answer_tags'"


def test_a_timeout_raised_by_the_reward_is_a_failure_not_our_timeout():
    def calls_a_judge(session: SessionView) -> float:
        raise TimeoutError("judge did not answer")

    assert run(calls_a_judge, name="judge").error == "reward judge failed: TimeoutError: judge did not answer"


def test_sync_and_async_overruns_time_out():
    release = threading.Event()

    def slow(session: SessionView) -> float:
        release.wait(10)
        return 1.0

    async def slow_async(session: SessionView) -> float:
        await asyncio.sleep(10)
        return 1.0

    started = time.monotonic()
    assert run(slow, 0.2, "slow").error == "reward slow timed out after 0.2s"
    assert run(slow_async, 0.2, "slow_async").error == "reward slow_async timed out after 0.2s"
    assert time.monotonic() - started < 2
    release.set()


def test_stuck_sync_rewards_leave_the_loops_executor_free():
    """The store's reads run in the loop's default executor (a handful of threads on a small
    machine); abandoned reward threads must not be taken from it."""
    release = threading.Event()

    def stuck(session: SessionView) -> float:
        release.wait(30)
        return 1.0

    async def main() -> None:
        slots = RewardSlots(64)
        results = await asyncio.gather(*(score(stuck, view("c1"), 0.2, slots, name="stuck") for _ in range(40)))
        assert {r.error for r in results} == {"reward stuck timed out after 0.2s"}
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "a store read"), 2) == "a store read"

    try:
        asyncio.run(main())
    finally:
        release.set()


def test_validate_refuses_a_completion_of_another_session():
    with pytest.raises(ValueError, match="not in this session"):
        validate({"x": 1.0}, {"c1"})


def test_sync_rewards_run_on_a_bounded_pool():
    """At most `max_workers` sync rewards run at once; stuck ones hold their slots, so the next
    call times out waiting for a worker instead of starting one more thread."""
    running, most = 0, 0
    lock = threading.Lock()
    release = threading.Event()

    def slow(session: SessionView) -> float:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.2)
        with lock:
            running -= 1
        return 1.0

    def stuck(session: SessionView) -> float:
        release.wait(30)
        return 1.0

    async def main() -> None:
        slots = RewardSlots(2)
        results = await asyncio.gather(*(score(slow, view("c1"), 10, slots, name="slow") for _ in range(6)))
        assert all(r.total == 1.0 for r in results) and most == 2
        threads = threading.active_count()
        stuck_results = await asyncio.gather(*(score(stuck, view("c1"), 0.3, slots, name="stuck") for _ in range(2)))
        assert {r.error for r in stuck_results} == {"reward stuck timed out after 0.3s"}
        late = await score(slow, view("c1"), 0.3, slots, name="slow")
        assert late.error == "reward slow timed out after 0.3s waiting for one of 2 reward workers"
        assert threading.active_count() <= threads + 2, "only the two stuck threads were added"

    try:
        asyncio.run(main())
    finally:
        release.set()
