"""`[eval]`: what `areal-proxy eval` and evaluation during training run, and how often.

An evaluation runs the `[rollout]` agent, unchanged, on a held-out split through the proxy, scores
each episode with the rollout's reward function, and reports accuracy with its interval, pass@k,
a breakdown by task field and what the episodes did. Its sessions are evaluation sessions: recorded
like any other, never claimed by a trainer. Pydantic only, so the CLI's `--help` stays instant.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from proxy.sections import Section


class EvalConfig(Section):
    dataset: str = ""
    """Evaluation tasks, as `rollout.dataset` names them (empty: the rollout's dataset, its `split`)."""
    split: str = "eval"
    """The split asked of the dataset (a dataset function's `split` argument; `hf:` datasets' split)."""
    max_tasks: int = Field(default=0, ge=0)
    """Evaluate only the first this many tasks of the split (0: all of them)."""
    samples: int = Field(default=1, ge=1, le=1024)
    """Episodes per task: pass@k is reported for k up to this."""
    temperature: float | None = Field(default=1.0, ge=0, le=2)
    """Sampling temperature forced on every call of an evaluation episode (0: greedy); `false` leaves
    it to the agent's own calls."""
    seed: int = 0
    """Sampling seeds derive from this and the task id alone, so two evaluations (two checkpoints, two
    steps of a run) sample each task from the same seeds and their difference is paired."""
    success: float = 1.0
    """An episode whose reward is at least this counts as solved (accuracy, pass@k)."""
    by: list[str] = Field(default_factory=list)
    """Task fields to break results down by (empty: every field whose values are short strings or
    integers taking 2 to 20 values, such as `kind`)."""
    concurrency: int = Field(default=0, ge=0)
    """Evaluation episodes running at once (0: `rollout.concurrency`)."""
    episode_timeout_s: float = Field(default=0, ge=0)
    """An evaluation episode running longer than this fails (0: `rollout.episode_timeout_s`)."""
    every_steps: int = Field(default=0, ge=0)
    """During training: evaluate the policy every this many trainer steps (0: not by steps)."""
    every_minutes: float = Field(default=0, ge=0)
    """During training: evaluate once this many minutes have passed since the last evaluation (0: not by time)."""
    metric: Literal["accuracy", "reward_mean"] = "accuracy"
    """The score that ranks evaluations during training: the best one's checkpoint is kept."""
    keep_best: bool = True
    """During training: keep the checkpoint of the best evaluation as `checkpoints/best` (with `best.json`)."""
    final: bool = True
    """During training: evaluate the last policy when the run ends by its `max_steps` or `max_minutes`."""

    @property
    def periodic(self) -> bool:
        return self.every_steps > 0 or self.every_minutes > 0

    @field_validator("temperature", mode="before")
    @classmethod
    def _false_is_agents(cls, value: object) -> object:
        return None if value is False else value

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        for name in self.by:
            if not name:
                raise ValueError("eval.by names task fields: an empty name")
        return self
