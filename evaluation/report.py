"""An evaluation's report from its recorded episodes, as JSON and as a terminal table.

Everything is counted over the store's rows (`proxy/store/evals.py`): an episode is solved when its
session finished with a reward of at least `eval.success`; a failed episode (agent error, timeout,
reward error) counts as unsolved and is listed by cause; the mean reward is over scored episodes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from evaluation.config import EvalConfig
from evaluation.stats import accuracy, breakdown_fields, mean_interval, paired_difference, pass_at
from proxy.store.evals import EvalEpisode

NOT_A_KIND = frozenset({"id", "task_id", "reference", "answer", "question", "prompt", "messages", "metadata"})


def failure_cause(reason: str | None) -> str:
    """A failure reason without its particulars, so that causes can be counted."""
    if not reason:
        return "unknown"
    if reason.startswith("agent error: "):
        kind = reason[len("agent error: ") :].split(":", 1)[0]
        return f"agent error: {kind}"
    head = reason.split(":", 1)[0]
    return re.sub(r"\d+(\.\d+)?", "N", head).strip()


def _solved(e: EvalEpisode, success: float) -> bool:
    return e.status != "failed" and e.reward is not None and e.reward >= success


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def build_report(
    episodes: list[EvalEpisode],
    tasks: list[dict[str, Any]],
    cfg: EvalConfig,
    *,
    run: str,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    by_task: dict[str, list[EvalEpisode]] = {}
    for e in episodes:
        by_task.setdefault(e.task_id, []).append(e)
    outcomes = {tid: [_solved(e, cfg.success) for e in eps] for tid, eps in by_task.items()}
    rewards = {
        tid: [e.reward for e in eps if e.reward is not None and e.status != "failed"] for tid, eps in by_task.items()
    }
    scored = [r for rs in rewards.values() for r in rs]
    reward_mean, reward_low, reward_high = mean_interval([_mean(rs) for rs in rewards.values() if rs])
    versions = [v for e in episodes for v in (e.min_version, e.max_version) if v is not None]
    failed = [e for e in episodes if e.status == "failed"]
    unscored = [e for e in episodes if e.status != "failed" and e.reward is None]

    fields = cfg.by or breakdown_fields(tasks, NOT_A_KIND)
    task_by_id = {str(t["id"]): t for t in tasks}
    breakdown: dict[str, dict[str, Any]] = {}
    for name in fields:
        groups: dict[str, list[list[bool]]] = {}
        for tid, solved in outcomes.items():
            value = task_by_id.get(tid, {}).get(name)
            groups.setdefault(str(value), []).append(solved)
        breakdown[name] = {value: {**accuracy(per), "tasks": len(per)} for value, per in sorted(groups.items())}

    return {
        "run": run,
        **({"metadata": metadata} if metadata else {}),
        "tasks": len(by_task),
        "tasks_asked": len(tasks),
        "samples": cfg.samples,
        "temperature": cfg.temperature,
        "success": cfg.success,
        "episodes": len(episodes),
        "accuracy": accuracy(list(outcomes.values())),
        "reward_mean": {"value": reward_mean, "low": reward_low, "high": reward_high, "scored": len(scored)},
        "pass_at_k": pass_at(list(outcomes.values()), cfg.samples),
        "by": breakdown,
        "per_episode": {
            "turns": _mean([e.turns for e in episodes]),
            "output_tokens": _mean([e.output_tokens for e in episodes]),
            "prompt_tokens": _mean([e.prompt_tokens for e in episodes]),
            "tool_calls": _mean([e.tool_calls for e in episodes]),
        },
        "failures": dict(Counter(failure_cause(e.failure) for e in failed).most_common()),
        "unscored": len(unscored),
        "policy_versions": [min(versions), max(versions)] if versions else None,
        "per_task": {
            tid: {
                "solved": sum(outcomes[tid]),
                "episodes": len(outcomes[tid]),
                "reward_mean": _mean(rewards[tid]) if rewards[tid] else None,
            }
            for tid in sorted(outcomes)
        },
    }


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The paired difference a - b of two reports over the tasks both evaluated."""

    def solved(r: dict[str, Any]) -> dict[str, float]:
        return {t: v["solved"] / v["episodes"] for t, v in r["per_task"].items() if v["episodes"]}

    def reward(r: dict[str, Any]) -> dict[str, float]:
        return {t: v["reward_mean"] for t, v in r["per_task"].items() if v["reward_mean"] is not None}

    return {
        "a": a["run"],
        "b": b["run"],
        "accuracy": paired_difference(solved(a), solved(b)),
        "reward_mean": paired_difference(reward(a), reward(b)),
    }


def flat_metrics(report: dict[str, Any]) -> dict[str, float | int]:
    """The report's headline numbers as `eval_` metrics for metrics.jsonl, TensorBoard and W&B."""
    acc, rew = report["accuracy"], report["reward_mean"]
    out: dict[str, float | int] = {
        "eval_accuracy": acc["value"],
        "eval_accuracy_low": acc["low"],
        "eval_accuracy_high": acc["high"],
        "eval_reward_mean": rew["value"],
        "eval_episodes": report["episodes"],
        "eval_failed": sum(report["failures"].values()),
        "eval_turns": report["per_episode"]["turns"],
        "eval_output_tokens": report["per_episode"]["output_tokens"],
        "eval_tool_calls": report["per_episode"]["tool_calls"],
        "eval_seconds": report.get("seconds", 0.0),
    }
    if report["policy_versions"]:
        out["eval_version"] = report["policy_versions"][1]
    for k, value in report["pass_at_k"].items():
        out[f"eval_pass_at_{k}"] = value
    return {k: v for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}


def _pct(x: dict[str, Any]) -> str:
    if x["value"] is None or math.isnan(x["value"]):
        return "-"
    return f"{100 * x['value']:.1f}%  [{100 * x['low']:.1f}, {100 * x['high']:.1f}]"


def _num(x: dict[str, Any]) -> str:
    if x["value"] is None or math.isnan(x["value"]):
        return "-"
    return f"{x['value']:.4g}  [{x['low']:.4g}, {x['high']:.4g}]"


def render(report: dict[str, Any], comparison: dict[str, Any] | None = None, other: dict[str, Any] | None = None):
    """A rich renderable of the report (and of a comparison with `other`)."""
    from rich.console import Group as Stack
    from rich.table import Table

    def summary(r: dict[str, Any], title: str) -> Table:
        t = Table(title=title, show_header=False, min_width=60)
        t.add_column(style="bold")
        t.add_column()
        t.add_row("tasks / episodes", f"{r['tasks']} / {r['episodes']} ({r['samples']} per task)")
        temp = "the agent's own" if r["temperature"] is None else f"{r['temperature']:g}"
        t.add_row("temperature", temp)
        t.add_row("accuracy (95% interval)", _pct(r["accuracy"]))
        t.add_row("mean reward (95% interval)", _num(r["reward_mean"]))
        for k, v in r["pass_at_k"].items():
            t.add_row(f"pass@{k}", f"{100 * v:.1f}%")
        pe = r["per_episode"]
        t.add_row(
            "per episode",
            f"{pe['turns']:.2f} turns, {pe['output_tokens']:.1f} sampled tokens, {pe['tool_calls']:.2f} tool calls",
        )
        if r["policy_versions"]:
            lo, hi = r["policy_versions"]
            t.add_row("policy version", str(lo) if lo == hi else f"{lo}-{hi}")
        failures = ", ".join(f"{cause}: {n}" for cause, n in r["failures"].items()) or "none"
        t.add_row("failed episodes", failures)
        if r["unscored"]:
            t.add_row("finished without a reward", str(r["unscored"]))
        t.add_row("seconds", f"{r.get('seconds', 0):.1f}")
        return t

    parts: list[Any] = [summary(report, f"eval {report['run']}")]
    for name, values in report["by"].items():
        t = Table(title=f"by {name}")
        t.add_column(name)
        t.add_column("tasks", justify="right")
        t.add_column("accuracy (95% interval)")
        for value, acc in values.items():
            t.add_row(value, str(acc["tasks"]), _pct(acc))
        parts.append(t)
    if other is not None and comparison is not None:
        parts.append(summary(other, f"eval {other['run']}"))
        t = Table(title=f"paired difference: {comparison['a']} - {comparison['b']}", show_header=False)
        t.add_column(style="bold")
        t.add_column()
        acc = comparison["accuracy"]
        t.add_row("tasks in both", str(acc["tasks"]))
        t.add_row("accuracy difference (95% interval)", _pct(acc))
        t.add_row("reward difference (95% interval)", _num(comparison["reward_mean"]))
        parts.append(t)
    return Stack(*parts)
