"""Where a run's metrics go: one `Logger` interface, three destinations.

`metrics.jsonl` always (every value, as JSON, one line per `log` call: the progress display and
the web UI read it), TensorBoard under `run_dir/tensorboard` unless turned off, and Weights &
Biases when `[trainer.logging] wandb` is on (the optional `wandb` extra, imported only then).
TensorBoard and W&B get the numbers alone: nested dicts are flattened to `outer/inner` keys and
anything else that is not a number is left to metrics.jsonl. Rows may arrive out of step order
(an evaluation reports a step the trainer has passed), so W&B charts against the logged `step`
instead of its own counter, which only goes forward. A resumed run continues its W&B run: the
run id is kept in `run_dir/wandb_run_id`.
"""

from __future__ import annotations

import json
import numbers
import time
from pathlib import Path
from typing import Any, Protocol

from trainer.config import LoggingConfig

WANDB_ID_FILE = "wandb_run_id"
WANDB_INSTALL = "pip install 'areal-proxy[wandb]'"


class Logger(Protocol):
    def log(self, step: int, values: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(values: dict[str, Any], prefix: str = "") -> dict[str, float | int]:
    """The numbers in `values`, nested dicts flattened to `outer/inner` keys (bools as 0 or 1)."""
    found: dict[str, float | int] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(scalars(value, f"{name}/"))
        elif isinstance(value, bool):
            found[name] = int(value)
        elif isinstance(value, numbers.Real):
            found[name] = value
    return found


class JsonlLogger:
    """Every row, whole, as one JSON line with its step and wall time; flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a")

    def log(self, step: int, values: dict[str, Any]) -> None:
        row = {"step": step, "time": time.time(), **values}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardLogger:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(log_dir))

    def log(self, step: int, values: dict[str, Any]) -> None:
        for key, value in scalars(values).items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._writer.close()


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as e:
        raise ImportError(
            f"trainer.logging.wandb is on but wandb is not installed: {WANDB_INSTALL} "
            "(or set trainer.logging.wandb = false)"
        ) from e
    return wandb


class WandbLogger:
    """One W&B run per run_dir, continued when the run resumes."""

    STEP = "step"

    def __init__(self, run_dir: Path, cfg: LoggingConfig, run_config: dict[str, Any] | None = None) -> None:
        wandb = self._wandb = _import_wandb()
        id_file = run_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        root = Path(cfg.wandb_dir) if cfg.wandb_dir else run_dir
        root.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=cfg.wandb_project or None,
            entity=cfg.wandb_entity or None,
            name=cfg.wandb_run_name or run_dir.resolve().name,
            tags=cfg.wandb_tags or None,
            mode=cfg.wandb_mode or None,  # None: WANDB_MODE, else online
            dir=str(root),
            config=run_config,
            id=run_id,
            resume="allow" if run_id else None,
        )
        if run_id is None:
            id_file.write_text(self.run.id + "\n")
        self.run.define_metric(self.STEP)
        self.run.define_metric("*", step_metric=self.STEP)

    def log(self, step: int, values: dict[str, Any]) -> None:
        self.run.log({**scalars(values), self.STEP: step})

    def close(self) -> None:
        self.run.finish()
        # finish() can return before wandb's service process has written the run's last records;
        # teardown waits for it, where the atexit hook that would may not run (a Ray actor's exit).
        self._wandb.teardown()


def open_loggers(run_dir: Path, cfg: LoggingConfig, run_config: dict[str, Any] | None = None) -> list[Logger]:
    """The loggers `cfg` asks for, metrics.jsonl first; `run_config` is what W&B records as the run's config."""
    # W&B first: a missing package or login fails before any file is opened.
    remote = WandbLogger(run_dir, cfg, run_config) if cfg.wandb else None
    loggers: list[Logger] = [JsonlLogger(run_dir / "metrics.jsonl")]
    if cfg.tensorboard:
        loggers.append(TensorBoardLogger(run_dir / "tensorboard"))
    if remote is not None:
        loggers.append(remote)
    return loggers
