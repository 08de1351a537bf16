"""Learning-rate schedule: linear warm-up, then constant or decayed over the run's budget.

A run's budget is `trainer.max_steps`, `trainer.max_minutes` or both; its progress is the larger of
the two fractions spent, so a time-boxed run ("train for 30 minutes") ends its decay when its time
does, on a fast machine or a slow one. Decaying to the end of a known budget is what budgeted
training recommends over a constant rate (Li et al., arXiv 1905.04753).
"""

from __future__ import annotations

import math

from trainer.config import ScheduleConfig


def progress(step: int, elapsed_s: float, max_steps: int, max_minutes: float) -> float:
    """The fraction of the run's budget spent, in [0, 1]; 0 when the run has no budget."""
    spent = 0.0
    if max_steps > 0:
        spent = max(spent, step / max_steps)
    if max_minutes > 0:
        spent = max(spent, elapsed_s / (60.0 * max_minutes))
    return min(spent, 1.0)


def lr_factor(schedule: ScheduleConfig, step: int, spent: float) -> float:
    """The multiplier of `optim.lr` for step `step` (1-based) at `spent` of the budget."""
    warm = min(1.0, step / schedule.warmup_steps) if schedule.warmup_steps else 1.0
    if schedule.shape == "constant":
        return warm
    spent = min(max(spent, 0.0), 1.0)
    shape = 1.0 - spent if schedule.shape == "linear" else 0.5 * (1.0 + math.cos(math.pi * spent))
    return warm * (schedule.min_lr_ratio + (1.0 - schedule.min_lr_ratio) * shape)
