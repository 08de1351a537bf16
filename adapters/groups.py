"""What the episode runner and its rollout strategies share: a group as it runs, the group to
start next, and the runner's counts (the progress display reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Group:
    """A started group as the runner tracks it until its last session has ended."""

    task: dict[str, Any]
    retry: bool
    left: int  # sessions not yet ended
    held: list[dict[str, Any]] = field(default_factory=list)  # created, not run until the screen decides
    screening: int = 0  # screen episodes still running
    screen_rewards: set[float] = field(default_factory=set)
    rewards: set[float] = field(default_factory=set)  # distinct rewards of its ended sessions
    kind: str | None = None  # the task's kind, when tasks are drawn by kind

    @property
    def earned(self) -> bool:
        """Some session scored above 0."""
        return any(r > 0 for r in self.rewards)


@dataclass(frozen=True)
class NextGroup:
    """The group to start next: its task, group id, size and how many of it run first."""

    task: dict[str, Any]
    group_id: str
    size: int
    first: int
    kind: str | None = None
    retry: bool = False


@dataclass
class RunnerStats:
    tasks_started: int = 0
    episodes_started: int = 0
    episodes_finished: int = 0
    episodes_failed: int = 0
    admission_waits: int = 0
    hard_groups: int = 0  # retry groups started ([rollout.retry])
    screened_out: int = 0  # groups ended after their screen ([rollout.screen])
    reward_sum: float = 0.0
    recent_rewards: list[float] = field(default_factory=list)

    def record(self, reward: float | None) -> None:
        if reward is None:
            return
        self.reward_sum += reward
        self.recent_rewards = (self.recent_rewards + [reward])[-256:]
