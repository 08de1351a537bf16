"""Rollout strategies: which task runs next, which groups are screened, which run again.

The episode runner asks three, each chosen by a `[rollout]` sub-section being present: a task
order (`DatasetOrder`, or `BalancedOrder` with [rollout.balance], adapters/balance.py), a screen
(`ScreenGroups` with [rollout.screen], SPEED; else `NoScreen`) and a retry (`RetryUnrewarded`
with [rollout.retry]; else `NoRetry`). In this order: a queued retry starts before any new task,
whole; otherwise the order picks the task and the screen how many of its samples run first; when
a group ends, the order learns its rewards, then the retry may queue it.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from adapters.balance import BalancedOrder
from adapters.config import RolloutConfig
from adapters.groups import Group, NextGroup, RunnerStats


class TaskOrder(Protocol):
    def next(self, started: int) -> tuple[dict[str, Any], str, str | None]:
        """The next new task, its group id (unique per pass over the data) and its kind, after
        `started` tasks."""

    def started(self, kind: str | None) -> None:
        """The task drawn last had its group created: move on."""

    def ended(self, group: Group) -> None:
        """A group has ended (every session scored or failed)."""

    def state(self) -> dict[str, Any]:
        """What to save with the runner's position, to resume the same order."""

    def rows(self) -> list[tuple[str, str]]:
        """Lines of the progress display."""


class DatasetOrder:
    """The dataset in one shuffled order (`rollout.seed`), cycled."""

    def __init__(self, tasks: list[dict[str, Any]], seed: int) -> None:
        self.tasks = tasks
        self.order = list(range(len(tasks)))
        random.Random(seed).shuffle(self.order)

    def next(self, started: int) -> tuple[dict[str, Any], str, str | None]:
        task = self.tasks[self.order[started % len(self.order)]]
        return task, f"{task['id']}@{started // len(self.order)}", None

    def started(self, kind: str | None) -> None:
        pass

    def ended(self, group: Group) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {}

    def rows(self) -> list[tuple[str, str]]:
        return []


class Screen(Protocol):
    def first(self, size: int) -> int:
        """How many of a new group's `size` samples run first (`size`: the whole group, no screen)."""

    def verdict(self, rewards: set[float]) -> str | None:
        """After the first ones, given their distinct rewards: None runs the rest; otherwise the
        reason the rest are ended unrun."""

    def rows(self, stats: RunnerStats) -> list[tuple[str, str]]:
        """Lines of the progress display."""


class NoScreen:
    def first(self, size: int) -> int:
        return size

    def verdict(self, rewards: set[float]) -> str | None:
        return None

    def rows(self, stats: RunnerStats) -> list[tuple[str, str]]:
        return []


class ScreenGroups:
    """SPEED: all of a group's sessions are created (so it can never be claimed in part), the agent runs
    on the first `size`, and the rest run only if those rewards differ. A group whose first rewards are
    all equal (a prompt the policy always fails or always solves) would almost surely have zero reward
    variance, which GRPO skips; its other sessions are ended unrun, as failed, "screened out"."""

    def __init__(self, size: int) -> None:
        self.size = size

    def first(self, size: int) -> int:
        return self.size

    def verdict(self, rewards: set[float]) -> str | None:
        if len(rewards) > 1:  # the prompt can go either way: run the rest
            return None
        if rewards:
            return f"screened out: the group's first {self.size} episodes all scored {next(iter(rewards)):g}"
        return f"screened out: the group's first {self.size} episodes all failed"

    def rows(self, stats: RunnerStats) -> list[tuple[str, str]]:
        return [("groups screened out", f"{stats.screened_out} of {stats.tasks_started}")]


class Retry(Protocol):
    def next(self) -> NextGroup | None:
        """A group to run before any new task, if one is queued."""

    def ended(self, group_id: str, group: Group) -> None:
        """A group has ended: queue it to run again, or not."""

    def rows(self, stats: RunnerStats) -> list[tuple[str, str]]:
        """Lines of the progress display."""


class NoRetry:
    def next(self) -> NextGroup | None:
        return None

    def ended(self, group_id: str, group: Group) -> None:
        pass

    def rows(self, stats: RunnerStats) -> list[tuple[str, str]]:
        return []


class RetryUnrewarded:
    """A task whose whole group earned no reward runs once more as a group of `group_size`: with a success
    rate of a few percent a group of 8 rarely holds the single success GRPO needs to learn from a prompt,
    and a group of 32 often does. A retry group is never retried."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self._queue: deque[tuple[dict[str, Any], str]] = deque()  # (task, group id of its first try)

    def next(self) -> NextGroup | None:
        if not self._queue:
            return None
        task, first_try = self._queue.popleft()
        return NextGroup(task, f"{first_try}+hard", self.group_size, self.group_size, retry=True)

    def ended(self, group_id: str, group: Group) -> None:
        if not group.retry and not group.earned:
            self._queue.append((group.task, group_id))

    def rows(self, stats: RunnerStats) -> list[tuple[str, str]]:
        return [("retry groups (no reward at first)", str(stats.hard_groups))]


@dataclass
class Strategies:
    order: TaskOrder
    screen: Screen
    retry: Retry


def strategies(cfg: RolloutConfig, tasks: list[dict[str, Any]], saved: dict[str, Any]) -> Strategies:
    """The strategies `cfg` turns on; `saved` is the runner's saved state, to resume the task order."""
    order: TaskOrder = DatasetOrder(tasks, cfg.seed)
    if cfg.balance:
        order = BalancedOrder(tasks, cfg.balance, cfg.seed, saved.get("kind_positions", {}))
    return Strategies(
        order=order,
        screen=ScreenGroups(cfg.screen.size) if cfg.screen else NoScreen(),
        retry=RetryUnrewarded(cfg.retry.group_size) if cfg.retry else NoRetry(),
    )
