"""Which kind of task runs next, so that every kind keeps yielding groups to learn from.

GRPO learns only from groups whose rewards differ. Kinds of task reach that at different rates
(an easy kind's groups are soon all right, a hard kind's all wrong), so a dataset drawn evenly
trains mostly on the kind that is learning fastest, and the others fall behind or drift (on the
arithmetic quickstart, additions made 2.7 times the trained groups of subtractions).

`KindBalancer` keeps, per kind (the value of one task field, `rollout.balance.by`), the share of
its recent groups that had reward variance (`informative`) and the share whose every reward was
the same positive value (`solved`), and draws the next kind with probability proportional to

    (1 - solved) / max(informative, floor)

so each kind contributes about equally to what is trained, a kind the policy has solved fades
out instead of soaking up rollouts, and the floor bounds what a kind that never yields a signal
can take (goal "even").

With goal "signal" the rollouts go where the signal is instead: a kind is drawn with probability
proportional to

    size · max(informative, floor)

(size: how many tasks the kind has), so while every kind is about as informative the tasks are
drawn as evenly as without balancing, and a kind whose groups all score alike (solved, or out of
the policy's reach) falls to the floor's share. It spends the episodes that the screen or the
trainer would have thrown away on kinds whose groups get trained; the floor keeps every kind
tried, so a kind that starts to yield a signal is seen again.

The shares are smoothed while few groups are known (informative starts at 1/2). `BalancedOrder` is
the episode runner's task order with `[rollout.balance]`: each kind's tasks in their own shuffled
order, the next kind drawn by the balancer.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adapters.config import BalanceConfig

if TYPE_CHECKING:
    from adapters.groups import Group


class KindBalancer:
    def __init__(
        self,
        kinds: list[str],
        seed: int = 0,
        window: int = 64,
        floor: float = 0.2,
        goal: str = "even",
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        if not kinds:
            raise ValueError("no kinds to balance")
        if goal not in ("even", "signal"):
            raise ValueError(f"balance goal {goal!r}: use 'even' or 'signal'")
        self.kinds = list(dict.fromkeys(kinds))
        self.floor = floor
        self.goal = goal
        self.sizes = {k: (sizes or {}).get(k, 1) for k in self.kinds}
        self._recent: dict[str, deque[tuple[bool, bool]]] = {k: deque(maxlen=window) for k in self.kinds}
        self._rng = random.Random(seed)

    def informative(self, kind: str) -> float:
        """(groups with reward variance + 1) / (groups + 2) over the kind's recent groups."""
        recent = self._recent[kind]
        return (sum(i for i, _ in recent) + 1) / (len(recent) + 2)

    def solved(self, kind: str) -> float:
        """(groups whose rewards were all the same positive value) / (groups + 2)."""
        recent = self._recent[kind]
        return sum(s for _, s in recent) / (len(recent) + 2)

    def weights(self) -> dict[str, float]:
        """Probability of each kind being drawn next."""
        if self.goal == "signal":
            raw = {k: self.sizes[k] * max(self.informative(k), self.floor) for k in self.kinds}
        else:
            raw = {k: (1.0 - self.solved(k)) / max(self.informative(k), self.floor) for k in self.kinds}
        total = sum(raw.values())
        return {k: w / total for k, w in raw.items()}

    def choose(self) -> str:
        weights = self.weights()
        return self._rng.choices(self.kinds, weights=[weights[k] for k in self.kinds])[0]

    def record(self, kind: str, rewards: set[float]) -> None:
        """A group of `kind` ended with these distinct rewards."""
        if kind in self._recent and rewards:
            informative = len(rewards) > 1
            self._recent[kind].append((informative, not informative and min(rewards) > 0))


class BalancedOrder:
    """Tasks drawn kind by kind: the kind by a `KindBalancer`, then that kind's next task in its own
    shuffled order (a task order of `adapters/strategies.py`). `positions` (tasks started per kind) is
    saved with the runner's position, so a resumed run goes on where each kind stood."""

    def __init__(
        self, tasks: list[dict[str, Any]], cfg: BalanceConfig, seed: int, positions: Mapping[str, int]
    ) -> None:
        self.tasks, self.by = tasks, cfg.by
        missing = [str(t.get("id")) for t in tasks if cfg.by not in t]
        if missing:
            raise ValueError(
                f"rollout.balance.by = {cfg.by!r}, but {len(missing)} tasks have no {cfg.by!r} field "
                f"(first: {missing[0]}); add it to every task or leave [rollout.balance] out"
            )
        self._order: dict[str, list[int]] = {}
        for i, task in enumerate(tasks):
            self._order.setdefault(str(task[cfg.by]), []).append(i)
        for k, order in enumerate(self._order.values()):
            random.Random(seed * 1000 + k).shuffle(order)
        self.positions = {kind: int(positions.get(kind, 0)) for kind in self._order}
        self.balancer = KindBalancer(
            sorted(self._order),
            seed=seed + sum(self.positions.values()),
            floor=cfg.floor,
            goal=cfg.goal,
            sizes={kind: len(order) for kind, order in self._order.items()},
        )

    def next(self, started: int) -> tuple[dict[str, Any], str, str | None]:
        kind = self.balancer.choose()
        indices, i = self._order[kind], self.positions[kind]  # moved on once the group is created
        task = self.tasks[indices[i % len(indices)]]
        return task, f"{task['id']}@{i // len(indices)}", kind

    def started(self, kind: str | None) -> None:
        self.positions[kind] += 1

    def ended(self, group: Group) -> None:
        if group.kind is not None:
            self.balancer.record(group.kind, group.rewards)

    def state(self) -> dict[str, Any]:
        return {"kind_positions": self.positions}

    def rows(self) -> list[tuple[str, str]]:
        weights = self.balancer.weights()
        kinds = " · ".join(f"{k} {n} ({weights[k]:.0%} next)" for k, n in sorted(self.positions.items()))
        return [(f"tasks by {self.by}", kinds)]
