"""A group's advantages as the trainer computes them, for the group page.

The trainer normalises each claim's rewards with the configured estimator (`trainer/advantages.py`,
`[trainer.loss] advantage`) over the sessions it was handed: a group's finished sessions, less those
dropped as stale and those PODS down-sampling left out (`trainer/selection.py`). The same functions
run here on the same rewards, so the page shows the numbers the loss used: a session's advantage
`(reward - b) / s`, each turn's `(return - b) / s`. Two estimators need more than the group:
REINFORCE++'s scale is the std over the step's whole batch, read back from the sessions that step
claimed (over the group alone until it is claimed); a flat group that a step trained anyway was
trained as unsolved, with `[trainer.unsolved] advantage`. torch is imported on first use only, so
the UI alone starts without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.store.claims import DROPPED_STALE

IN_CLAIM = ("finished", "training", "consumed")
DOWNSAMPLED = "skipped: down-sampled"


@dataclass(frozen=True)
class SessionAdvantage:
    reward: float  # as the trainer reads it (an unscored finished session counts 0.0)
    baseline: float
    scale: float
    advantage: float
    flat: bool  # its group's rewards are all equal: no signal (skipped unless trained as unsolved)
    unsolved: bool = False  # a flat group trained with [trainer.unsolved] advantage


def group_key(row: Any) -> str:
    """The trainer's group of a session (`proxy.store.samples`): its group, else its task, else itself."""
    return row.group_id or row.task_id or row.id


def in_claim(row: Any) -> bool:
    """Whether the trainer normalises this session's reward with its group's (or will, once claimed)."""
    if row.status not in IN_CLAIM or row.eval or row.auto:
        return False
    if row.consumed_step == DROPPED_STALE:
        return False
    return not (row.failure or "").startswith(DOWNSAMPLED)


def advantages(
    rows: list[Any], estimator: str, *, batch: list[Any] | None = None, unsolved_advantage: float | None = None
) -> dict[str, SessionAdvantage]:
    """Per session id of `rows` (one group) in a claim: what the trainer's estimator gives it.

    `batch` is the step's claimed sessions, for estimators whose scale spans the batch; the group's
    own sessions are used when it is None.
    """
    import torch

    from trainer.advantages import ADVANTAGES

    mine = [r for r in rows if in_claim(r)]
    if not mine:
        return {}
    pool = {r.id: r for r in mine}
    if batch is not None:
        pool.update({r.id: r for r in batch if in_claim(r)})
    members = list(pool.values())
    keys = {k: i for i, k in enumerate(dict.fromkeys(group_key(r) for r in members))}
    rewards = torch.tensor([float(r.reward or 0.0) for r in members], dtype=torch.float64)
    group_ids = torch.tensor([keys[group_key(r)] for r in members])
    est = ADVANTAGES[estimator](rewards, group_ids)
    wanted = {r.id for r in mine}
    out = {}
    for i, row in enumerate(members):
        if row.id not in wanted:
            continue
        reward, flat = float(rewards[i]), bool(est.skipped[i])
        trained = row.consumed_step is not None and row.consumed_step >= 0
        if flat and trained and unsolved_advantage is not None:
            out[row.id] = SessionAdvantage(reward, reward - unsolved_advantage, 1.0, unsolved_advantage, flat, True)
            continue
        baseline, scale = float(est.baseline[i]), float(est.scale[i]) or 1.0
        out[row.id] = SessionAdvantage(reward, baseline, scale, 0.0 if flat else (reward - baseline) / scale, flat)
    return out


BATCH_WIDE = {"reinforce_pp"}
"""Estimators whose scale is taken over the whole batch, not the group."""
