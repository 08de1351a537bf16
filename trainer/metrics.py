"""Training metrics: one JSON line per step (run_dir/metrics.jsonl) and TensorBoard."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class MetricsSink:
    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, step: int, values: dict[str, Any]) -> None:
        row = {"step": step, "time": time.time(), **values}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


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
