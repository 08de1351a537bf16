"""`[rollout]` and its strategy sub-sections: which tasks the episode runner runs, and how.

`[rollout]` names the dataset, the agent and the reward, and sizes the groups; each
sub-section present turns a rollout strategy on (`adapters/strategies.py`):
`[rollout.balance]` draws tasks by kind, `[rollout.screen]` runs a group's first samples
before the rest, `[rollout.retry]` runs a task that earned nothing once more as a larger
group. Pydantic only, so the CLI's `--help` stays instant.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from proxy.sections import Section, Strategy


class ScreenConfig(Section):
    """Group screening (SPEED, Zhang et al. 2025, arXiv 2506.09016): a new group's first `size` samples
    run first and the rest only if their rewards differ; a group they all scored alike is ended there, as
    GRPO would skip it, and the generation it would have cost goes to other prompts."""

    size: int
    """Samples of a group run first (from 2 to rollout.group_size - 1)."""


class RetryConfig(Section):
    """A task whose whole group earned no reward is run once more, ahead of new tasks, as one larger
    group, so a hard prompt shows a success to learn from."""

    group_size: int = Field(ge=1)
    """Samples of the retry group (at most rollout.concurrency)."""


class BalanceConfig(Section):
    """Draw the next task's kind (the value of one task field) so that kinds keep yielding groups with
    reward variance, each kind's tasks in their own shuffled order (adapters/balance.py)."""

    by: str = Field(min_length=1)
    """The task field whose values are the kinds (e.g. "kind"); every task needs it."""
    goal: Literal["even", "signal"] = "even"
    """"even" draws the kinds so each yields about as many groups with reward variance (a kind that rarely
    does is drawn more, up to the floor); "signal" draws each kind in proportion to its size times its share
    of groups with reward variance, so rollouts go to the kinds that are trained and a solved or hopeless
    kind falls to the floor."""
    floor: float = Field(default=0.2, gt=0, le=1)
    """The least share of groups with reward variance a kind is credited with when drawing: bounds
    what a hopeless kind takes ("even") or keeps it tried ("signal")."""


class RolloutConfig(Section):
    dataset: str = ""
    """Dataset: a name known to the agent module, a .jsonl path, or hf:owner/name[:split]."""
    agent: str = ""
    """Agent: `module:function` (async def run(task, base_url, api_key)) or a shell command."""
    reward_fn: str = "math_exact"
    """Registered reward function that scores each finished session."""
    group_size: int = 8
    """Samples per task; one group for group-relative advantages."""
    concurrency: int = 32
    """Episodes running at once."""
    episode_timeout_s: float = 300.0
    """An episode running longer than this ends its session as failed."""
    max_tasks: int = 0
    """Stop after this many tasks (0: the whole dataset, cycling until the trainer stops)."""
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    """Sampling temperature forced on every call of a training episode, whatever the agent asks (its
    calls are recorded, and trained, at it). Unset: each call's own. For agents whose client cannot
    set one (the Claude Code CLI behind the Claude Agent SDK sends none, so 1.0)."""
    seed: int = 0
    """Dataset shuffling seed, and the seed every group's sampling seed is derived from (with its group
    id), so a run's rollouts are reproducible."""
    balance: Strategy[BalanceConfig] = None
    """Present: draw tasks by kind (off when absent or false: dataset order)."""
    screen: Strategy[ScreenConfig] = None
    """Present: screen each new group on its first samples (off when absent or false)."""
    retry: Strategy[RetryConfig] = None
    """Present: retry a task whose group earned nothing as one larger group (off when absent or false)."""

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.screen and not 2 <= self.screen.size < self.group_size:
            raise ValueError(
                f"rollout.screen.size {self.screen.size} must be from 2 to rollout.group_size - 1 "
                f"({self.group_size - 1}): the screen needs two rewards to compare and must leave samples "
                "to save (or leave [rollout.screen] out)"
            )
        for size in (self.group_size, self.retry.group_size if self.retry else 0):
            if size > self.concurrency:
                raise ValueError(
                    f"a group of {size} starts together: rollout.concurrency ({self.concurrency}) must be at least that"
                )
        return self
