"""Training metrics: a run's one sink for them, a stall detector, and reading them back.

`MetricsSink` hands every row to the loggers `[trainer.logging]` asks for (`trainer/loggers.py`):
run_dir/metrics.jsonl always, TensorBoard, Weights & Biases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.config import LoggingConfig
from trainer.loggers import open_loggers


class MetricsSink:
    """`cfg` picks the loggers; without one, metrics.jsonl and (with `tensorboard`) TensorBoard.
    `run_config` is the run's effective configuration, recorded once by W&B."""

    def __init__(
        self,
        run_dir: Path,
        cfg: LoggingConfig | None = None,
        run_config: dict[str, Any] | None = None,
        *,
        tensorboard: bool = True,
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        cfg = cfg if cfg is not None else LoggingConfig(tensorboard=tensorboard)
        self.loggers = open_loggers(run_dir, cfg, run_config)

    def log(self, step: int, values: dict[str, Any]) -> None:
        """One row at `step`: every JSON-able value to metrics.jsonl, the numbers to the others."""
        for logger in self.loggers:
            logger.log(step, values)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


class StallWatch:
    """Notices a run that has stopped learning: `limit` steps in a row that trained nothing
    because every claimed group's rewards were equal.

    With groups skipped for zero reward variance, a policy that has collapsed (every sample
    wrong, e.g. replies cut short or rambling past `max_tokens`) yields almost no gradient and
    hardly recovers by itself; seen on the arithmetic example with `max_staleness` 3 and 4.
    """

    def __init__(self, limit: int = 20) -> None:
        self.limit = limit
        self._reset()

    @property
    def stalled(self) -> bool:
        """Whether the last `limit` steps (or more) in a row trained nothing."""
        return self.limit > 0 and self.empty >= self.limit

    def _reset(self) -> None:
        self.empty = 0
        self._count = 0
        self._sum = 0.0
        self._low = float("inf")
        self._high = float("-inf")

    def update(self, trained_samples: int, rewards: list[float]) -> str | None:
        """Record one step; a warning to log when the run has stalled (again every `limit` steps)."""
        if trained_samples or not rewards:
            self._reset()
            return None
        self.empty += 1
        self._count += len(rewards)
        self._sum += sum(rewards)
        self._low, self._high = min(self._low, *rewards), max(self._high, *rewards)
        if not self.limit or self.empty % self.limit:
            return None
        mean = self._sum / self._count
        alike = self._low == self._high
        what = f"every sample earned {mean:.3g}" if alike else f"mean reward {mean:.3f}, each group's samples alike"
        if alike and mean >= 1.0:
            hint = "the task looks solved (or too easy for this reward)"
        else:
            hint = (
                "if reward fell from earlier steps the policy has collapsed: lower trainer.optim.lr or "
                "trainer.max_staleness and restart, from a checkpoint before the fall if one is kept"
            )
        return f"no sample trained in the last {self.empty} steps ({what}): nothing is being learned; {hint}"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return rows


def progress_rows(run_dir: Path, max_steps: int) -> list[tuple[str, str]]:
    """The training half of a launcher's live table: step, version, recent reward and loss, and the
    last held-out evaluation ([eval]) beside the first."""
    rows_read = read_metrics(run_dir)
    steps = [r for r in rows_read if "reward_mean" in r]
    evals = [r for r in rows_read if "eval_accuracy" in r]
    last = steps[-1] if steps else {}
    recent = steps[-10:]
    rows = [
        ("step", f"{last.get('step', 0)}" + (f" / {max_steps}" if max_steps else "")),
        ("policy version", str(last.get("version", 0))),
    ]
    if recent:
        rows += [
            ("reward mean (last 10 steps)", f"{sum(r['reward_mean'] for r in recent) / len(recent):.3f}"),
            ("accuracy (last 10 steps)", f"{sum(r['accuracy'] for r in recent) / len(recent):.3f}"),
            ("staleness mean / max", f"{last['staleness_mean']:.2f} / {last['staleness_max']}"),
            ("samples/s (train)", f"{last['samples_per_s']:.1f}"),
            ("loss / grad norm", f"{last.get('loss', 0):.4f} / {last.get('grad_norm', 0):.3f}"),
        ]
        if "lr" in last:
            rows.append(("learning rate", f"{last['lr']:.3g}"))
    if evals:
        e = evals[-1]
        first = evals[0]
        rows.append(
            (
                f"held-out eval (step {e['step']}, v{e.get('eval_version', '?')})",
                f"{e['eval_accuracy']:.3f} [{e['eval_accuracy_low']:.3f}, {e['eval_accuracy_high']:.3f}]"
                + (f", from {first['eval_accuracy']:.3f} at step {first['step']}" if len(evals) > 1 else ""),
            )
        )
        if "eval_best_step" in e:
            rows.append(("best evaluated step", str(e["eval_best_step"])))
    if last.get("stalled_steps"):
        n = last["stalled_steps"]
        rows.append(("warning", f"nothing trained in {n} steps: every group scored alike (see trainer.log)"))
    return rows
