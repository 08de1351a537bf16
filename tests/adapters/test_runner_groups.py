"""The episode runner's groups: one group of `group_size` per task and, with `[rollout.retry]`,
one larger retry group for a task whose whole group earned nothing — never for one that
earned something, never twice; with `[rollout.screen]`, the rest of a group runs only when its
first episodes scored differently. Real proxy, real model, a reward that depends only on the
task (and, for "mixed", alternates 0, 1, 0, 1 … from call to call)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from adapters.config import RolloutConfig
from adapters.groups import RunnerStats
from adapters.runner import EpisodeRunner
from proxy.config import ConfigError, load_config
from tests.conftest import run_server

REWARDS = """
from rewards import reward


_mixed_calls = []


@reward("test_by_reference")
def by_reference(session) -> float:
    if session.reference == "mixed":
        _mixed_calls.append(1)
        return float(len(_mixed_calls) % 2)
    return 1.0 if session.reference == "easy" else 0.0
"""


async def one_call(task: dict, base_url: str, api_key: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    try:
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task["question"]}], max_tokens=2
        )
    finally:
        await client.close()


TASKS = [
    {"id": "e", "question": "Say hi.", "reference": "easy"},
    {"id": "h", "question": "Say bye.", "reference": "hard"},
    {"id": "m", "question": "Say yes.", "reference": "mixed"},
]


def run_tasks(
    tmp_path: Path, cfg: RolloutConfig, tasks: list[dict], state_path: Path | None = None
) -> tuple[RunnerStats, list[dict]]:
    """Run the runner to the end against a real server; its stats and every session it left."""
    module = tmp_path / "by_reference.py"
    module.write_text(REWARDS)
    with run_server(tmp_path, f"sqlite:///{tmp_path}/groups.db", "--rewards", str(module)) as server:
        runner = EpisodeRunner(cfg, server.url, tasks, agent=one_call, state_path=state_path)
        stats = asyncio.run(runner.run())
        listed = httpx.get(f"{server.url}/sessions", params={"limit": 100}).json()["data"]
    return stats, listed


def test_only_tasks_that_earned_nothing_get_one_larger_retry_group(tmp_path: Path):
    cfg = RolloutConfig(
        reward_fn="test_by_reference", group_size=2, retry={"group_size": 3}, concurrency=4, max_tasks=2
    )
    stats, listed = run_tasks(tmp_path, cfg, TASKS[:2])
    sizes = Counter(s["group_id"] for s in listed)
    assert sizes == {"e@0": 2, "h@0": 2, "h@0+hard": 3}, sizes
    assert all(s["status"] == "finished" for s in listed)
    rewards = {s["group_id"]: s["reward"] for s in listed}
    assert rewards == {"e@0": 1.0, "h@0": 0.0, "h@0+hard": 0.0}
    assert stats.tasks_started == 2 and stats.hard_groups == 1 and stats.episodes_finished == 7


def test_a_group_larger_than_the_concurrency_is_refused_with_the_fix():
    # A group waits for that many free slots before it starts: larger than the concurrency,
    # it would wait forever.
    with pytest.raises(ConfigError, match=r"a group of 24 starts together: rollout.concurrency \(16\)"):
        load_config(None, ["rollout.concurrency=16", "rollout.retry.group_size=24"])
    with pytest.raises(ConfigError, match=r"a group of 8 starts together"):
        load_config(None, ["rollout.concurrency=4"])
    assert load_config(None, ["rollout.concurrency=24", "rollout.retry.group_size=24"]).rollout.retry.group_size == 24


def test_a_group_runs_past_its_screen_only_when_the_screen_scored_differently(tmp_path: Path):
    cfg = RolloutConfig(reward_fn="test_by_reference", group_size=4, screen={"size": 2}, concurrency=4, max_tasks=3)
    stats, listed = run_tasks(tmp_path, cfg, TASKS)
    by_group: dict[str, Counter] = {}
    for s in listed:
        by_group.setdefault(s["group_id"], Counter())[s["status"]] += 1
    # every group was created whole (so it could never be claimed in part) and nothing is left open
    assert by_group == {
        "e@0": Counter(finished=2, failed=2),
        "h@0": Counter(finished=2, failed=2),
        "m@0": Counter(finished=4),
    }, by_group
    reasons = {(s["group_id"], s["failure"]) for s in listed if s["status"] == "failed"}
    assert reasons == {
        ("e@0", "screened out: the group's first 2 episodes all scored 1"),
        ("h@0", "screened out: the group's first 2 episodes all scored 0"),
    }
    mixed = sorted(s["reward"] for s in listed if s["group_id"] == "m@0")
    assert mixed == [0.0, 0.0, 1.0, 1.0]
    # screened-out sessions are not episodes that failed: no agent ever ran in them
    assert stats.screened_out == 2 and stats.episodes_finished == 8 and stats.episodes_failed == 0


def test_a_screen_that_cannot_compare_or_save_is_refused():
    for k in (1, 8):
        with pytest.raises(ConfigError, match=rf"rollout.screen.size {k} must be from 2 to rollout.group_size - 1"):
            load_config(None, [f"rollout.screen.size={k}"])
    assert load_config(None, ["rollout.screen.size=4"]).rollout.screen.size == 4


def test_a_stop_does_not_wait_for_a_busy_slot(tmp_path: Path):
    """With every slot held by an episode that would run for minutes, a stop (the run's last step,
    Ctrl-C) ends the runner at once: the next group no longer waits for a slot, and the episode
    in flight is cut short and its session ended as failed."""
    started = asyncio.Event()

    async def long_tool_call(task: dict, base_url: str, api_key: str) -> None:
        started.set()
        await asyncio.Event().wait()  # a tool that never answers

    async def run_then_stop(runner: EpisodeRunner) -> RunnerStats:
        stop = asyncio.Event()
        running = asyncio.create_task(runner.run(stop))
        await asyncio.wait_for(started.wait(), 120)
        stop.set()
        return await asyncio.wait_for(running, 60)  # the episode's own timeout is 600 s

    cfg = RolloutConfig(reward_fn="test_by_reference", group_size=1, concurrency=1, episode_timeout_s=600)
    module = tmp_path / "by_reference.py"
    module.write_text(REWARDS)
    with run_server(tmp_path, f"sqlite:///{tmp_path}/stop.db", "--rewards", str(module)) as server:
        runner = EpisodeRunner(cfg, server.url, TASKS, agent=long_tool_call)
        stats = asyncio.run(run_then_stop(runner))
        listed = httpx.get(f"{server.url}/sessions", params={"limit": 100}).json()["data"]
    assert stats.tasks_started == 1
    [session] = listed
    assert session["status"] == "failed", session
