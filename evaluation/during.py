"""Evaluation during training: the trainer evaluates its policy every N steps or M minutes.

Right after a step's weights reach the engine (version v), the trainer starts an evaluation of the
held-out split through the proxy in a background thread and goes on claiming and training the next
step; it waits for the evaluation only before its next push, so every evaluation episode samples
version v exactly (the report's `policy_versions` shows it) while rollouts continue beside it. The
result goes to the run's metrics as `eval_` keys at step s. With `keep_best`, the checkpoint of step s
is saved before the evaluation and, if the evaluation scores best so far, kept as
`checkpoints/best` with `checkpoints/best.json` (hard links: no second copy on disk; when the starting
policy is the best, best.json names the base model instead); a resumed run reads best.json and keeps
comparing against it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation.report import flat_metrics
from evaluation.run import eval_tasks, evaluate, new_run_name
from proxy.config import Config
from proxy.store.db import Database

log = logging.getLogger("areal_eval")

CANDIDATE = ".eval_candidate"


@dataclass
class Finished:
    """An evaluation that has ended: the step and version it evaluated, and its report (or error)."""

    step: int
    version: int
    report: dict[str, Any] | None
    error: str | None = None


class PeriodicEval:
    def __init__(self, cfg: Config, run_dir: Path, proxy_url: str) -> None:
        self.cfg = cfg
        self.e = cfg.eval
        self.url = proxy_url
        self.checkpoints = run_dir / "checkpoints"
        self.tasks = eval_tasks(cfg)
        self.db = Database(cfg.store)
        self.last_time = time.time()
        self.last_step = 0
        self.last_version: int | None = None
        self._thread: threading.Thread | None = None
        self._done: Finished | None = None
        self._cancel: Callable[[], None] | None = None  # stops the running evaluation, from any thread
        self._cancelled = threading.Event()
        self.best = self._read_best()

    # -- when -------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Whether step `step` (whose weights were just pushed) should be evaluated."""
        if self.running:
            return False
        by_steps = self.e.every_steps > 0 and step - self.last_step >= self.e.every_steps
        by_time = self.e.every_minutes > 0 and time.time() - self.last_time >= 60.0 * self.e.every_minutes
        return by_steps or by_time

    @property
    def running(self) -> bool:
        return self._thread is not None

    # -- run --------------------------------------------------------------------------
    def start(self, step: int, version: int, checkpoint: Path | None) -> None:
        """Evaluate version `version` (trained through step `step`) in the background; `checkpoint`,
        when given, is that step's checkpoint, kept as the best if this evaluation is."""
        self.last_step, self.last_time, self.last_version = step, time.time(), version
        if checkpoint is not None:
            candidate = self.checkpoints / CANDIDATE
            shutil.rmtree(candidate, ignore_errors=True)
            # hard links: later pruning of the step's checkpoint leaves the candidate whole
            shutil.copytree(checkpoint, candidate, copy_function=_link_or_copy)
        name = new_run_name(f"step{step}")
        self._cancelled.clear()
        self._thread = threading.Thread(
            target=self._run, args=(step, version, name), name=f"eval-step{step}", daemon=True
        )
        self._thread.start()

    def _run(self, step: int, version: int, name: str) -> None:
        async def run() -> dict[str, Any]:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            self._cancel = lambda: loop.call_soon_threadsafe(stop.set)
            if self._cancelled.is_set():  # cancelled before this thread got here
                stop.set()
            meta = {"step": step, "version": version}
            return await evaluate(self.cfg, self.url, self.db, name, tasks=self.tasks, metadata=meta, stop=stop)

        try:
            report = asyncio.run(run())
            if report.get("stopped"):
                self._done = Finished(step, version, None, "stopped: the trainer stopped during the evaluation")
            else:
                self._done = Finished(step, version, report)
        except Exception as exc:  # an evaluation that fails is reported; training goes on
            log.exception("evaluation of step %d failed", step)
            self._done = Finished(step, version, None, f"{type(exc).__name__}: {exc}")

    def collect(self, *, wait: bool) -> Finished | None:
        """The evaluation that has ended since the last call (waiting for a running one if `wait`)."""
        if self._thread is None:
            return None
        if not wait and self._thread.is_alive():
            return None
        self._thread.join()
        self._thread = None
        self._cancel = None
        done, self._done = self._done, None
        if done is not None and done.report is not None:
            self._keep_if_best(done)
        return done

    def metrics(self, done: Finished) -> dict[str, Any]:
        """What to log at the evaluated step."""
        if done.report is None:
            return {"eval_error": done.error or "failed"}
        values = flat_metrics(done.report)
        if self.best is not None:
            values["eval_best_step"] = self.best["step"]
        return values

    def cancel(self) -> None:
        """End the running evaluation now: its open episodes fail as stopped and it reports no score."""
        if self._thread is None:
            return
        self._cancelled.set()
        if self._cancel is not None:
            self._cancel()

    def close(self, *, cancel: bool = False) -> None:
        """Wait for a running evaluation, or with `cancel` end it now (the trainer is stopping)."""
        if cancel:
            self.cancel()
        self.collect(wait=True)
        shutil.rmtree(self.checkpoints / CANDIDATE, ignore_errors=True)
        self.db.close()

    # -- the best checkpoint ----------------------------------------------------------------
    def _read_best(self) -> dict[str, Any] | None:
        path = self.checkpoints / "best.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return None

    def _keep_if_best(self, done: Finished) -> None:
        assert done.report is not None
        score = done.report[self.e.metric]["value"]
        candidate = self.checkpoints / CANDIDATE
        better = self.best is None or score > self.best["score"]
        if not better or not self.e.keep_best:
            shutil.rmtree(candidate, ignore_errors=True)
            if not better:
                return
        best = {
            "step": done.step,
            "version": done.version,
            "metric": self.e.metric,
            "score": score,
            "eval_run": done.report["run"],
            "time": time.time(),
        }
        if done.step == 0:  # the starting policy: the base model, not a checkpoint
            best["model"] = self.cfg.trainer.model or self.cfg.engine.model
        elif self.e.keep_best and candidate.is_dir():
            final = self.checkpoints / "best"
            old = self.checkpoints / ".best_old"
            shutil.rmtree(old, ignore_errors=True)
            if final.exists():
                os.replace(final, old)
            os.replace(candidate, final)
            shutil.rmtree(old, ignore_errors=True)
            best["path"] = str(final)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        tmp = self.checkpoints / "best.json.tmp"
        tmp.write_text(json.dumps(best, indent=2) + "\n")
        os.replace(tmp, self.checkpoints / "best.json")
        self.best = best
        log.info("step %d is the best evaluated so far: %s %.4f", done.step, self.e.metric, score)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(src, dst)
