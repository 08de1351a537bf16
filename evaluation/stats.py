"""The numbers of an evaluation: accuracy with its interval, pass@k, breakdowns, paired differences.

Pure functions over per-task outcomes, so a report can be recomputed from the store by hand. A task
is the unit of sampling: with several episodes per task, their outcomes are correlated, so intervals
come from the spread of per-task means (a cluster-robust standard error), not from the episode count.
Accuracy intervals are Wilson score intervals (at an effective sample size when tasks have several
episodes), which stay inside [0, 1] and are sound at 0% and 100%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from math import comb

Z95 = 1.959963984540054  # the two-sided 95% quantile of the standard normal


def wilson(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927); `n` may be an effective size."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """Mean and its normal-approximation 95% interval from the sample standard deviation."""
    n = len(values)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    mean = sum(values) / n
    if n == 1:
        return (mean, mean, mean)
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = z * math.sqrt(var / n)
    return (mean, mean - half, mean + half)


def accuracy(per_task: Sequence[Sequence[bool]]) -> dict[str, float | int]:
    """Share of solved episodes and its 95% interval.

    One episode per task: the Wilson interval. Several: the episodes of a task are correlated, so the
    Wilson interval is taken at the effective sample size p(1-p)/se², se the cluster-robust standard
    error from the spread of per-task means, kept between the task and episode counts (and the task
    count when every task scored alike, where the spread says nothing)."""
    episodes = sum(len(t) for t in per_task)
    solved = sum(sum(t) for t in per_task)
    if episodes == 0:
        return {"value": math.nan, "low": math.nan, "high": math.nan, "solved": 0, "episodes": 0}
    p = solved / episodes
    clusters = [t for t in per_task if t]
    n = float(episodes)
    if any(len(t) > 1 for t in clusters):
        means = [sum(t) / len(t) for t in clusters]
        k = len(means)
        var = sum((m - p) ** 2 for m in means) / (k - 1) if k > 1 else 0.0
        n = p * (1 - p) / (var / k) if var > 0 and 0 < p < 1 else float(k)
        n = min(max(n, float(k)), float(episodes))
    low, high = wilson(p * n, n)
    return {"value": p, "low": low, "high": high, "solved": solved, "episodes": episodes}


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of P(at least one of k samples is correct) from n samples, c correct
    (Chen et al. 2021, arXiv 2107.03374): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, not {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_at(per_task: Sequence[Sequence[bool]], samples: int) -> dict[int, float]:
    """pass@k averaged over tasks for k = 1, 2, 4, … up to `samples` (and `samples` itself); tasks with
    fewer episodes than k (cut short by a failure to create them) are left out of that k."""
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if k <= samples} | {samples})
    out = {}
    for k in ks:
        values = [pass_at_k(len(t), sum(t), k) for t in per_task if len(t) >= k]
        if values:
            out[k] = sum(values) / len(values)
    return out


def paired_difference(a: dict[str, float], b: dict[str, float]) -> dict[str, float | int]:
    """Mean of a - b over the keys (tasks) both hold, and its 95% interval: the two evaluations share
    tasks and sampling seeds, so the per-task differences carry the comparison."""
    common = sorted(a.keys() & b.keys())
    diffs = [a[k] - b[k] for k in common]
    mean, low, high = mean_interval(diffs)
    return {"value": mean, "low": low, "high": high, "tasks": len(common)}


def breakdown_fields(tasks: Sequence[dict], exclude: frozenset[str] = frozenset()) -> list[str]:
    """Task fields worth a breakdown: short strings, booleans or integers taking 2 to 20 values, and
    fewer values than there are tasks (a field unique to each task is an id, not a kind)."""
    fields: dict[str, set] = {}
    for task in tasks:
        for name, value in task.items():
            if name in exclude:
                continue
            ok = isinstance(value, (bool, int)) or (isinstance(value, str) and len(value) <= 40)
            fields.setdefault(name, set()).add(value if ok else _TOO_LONG)
    most = min(20, len(tasks) - 1)
    return sorted(n for n, values in fields.items() if _TOO_LONG not in values and 2 <= len(values) <= most)


_TOO_LONG = object()
