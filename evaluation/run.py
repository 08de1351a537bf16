"""Running an evaluation: each held-out task's episodes through the proxy as evaluation sessions.

`EvalRunner` is the episode runner with three differences: every task of the split runs once, in
dataset order, as one group of `eval.samples` sessions; the sessions are created as evaluation
sessions (never claimed by a trainer, outside admission control) with the evaluation's forced
temperature; and a group's sampling seed derives from `eval.seed` and the task id only, so two
evaluations, of two checkpoints or of two steps of a run, sample every task from the same seeds
(their difference is then paired, and differs only where the policies do).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import Any

from adapters.config import RolloutConfig
from adapters.runner import EpisodeRunner
from adapters.strategies import DatasetOrder
from adapters.tasks import load_tasks
from evaluation.report import build_report
from proxy.config import Config
from proxy.seeds import derive_seed
from proxy.store.db import Database
from proxy.store.evals import eval_episodes, eval_group_id


def new_run_name(prefix: str = "") -> str:
    """A unique evaluation name: a prefix (a checkpoint, a step), the time and a random tag."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return "-".join(p for p in (prefix, stamp, secrets.token_hex(3)) if p)


def eval_tasks(cfg: Config) -> list[dict[str, Any]]:
    """The evaluation split's tasks, the first `eval.max_tasks` of them when set."""
    e = cfg.eval
    dataset = e.dataset or cfg.rollout.dataset
    tasks = load_tasks(dataset, e.split, e.seed)
    if not tasks:
        raise ValueError(f"the dataset {dataset!r} has no tasks in split {e.split!r}")
    return tasks[: e.max_tasks] if e.max_tasks else tasks


class _InOrder(DatasetOrder):
    """Every task once, in dataset order; a task's group is named by the evaluation and its id."""

    def __init__(self, tasks: list[dict[str, Any]], run: str) -> None:
        super().__init__(tasks, seed=0)
        self.run = run

    def next(self, started: int) -> tuple[dict[str, Any], str, str | None]:
        task = self.tasks[started]
        return task, eval_group_id(self.run, str(task["id"])), None


class EvalRunner(EpisodeRunner):
    def __init__(
        self,
        cfg: Config,
        proxy_url: str,
        tasks: list[dict[str, Any]],
        run: str,
        *,
        admin_key: str = "",
        metadata: dict[str, Any] | None = None,
        agent: Callable[..., Any] | str | None = None,
    ) -> None:
        e, r = cfg.eval, cfg.rollout
        concurrency = max(e.concurrency or r.concurrency, e.samples)
        rollout = RolloutConfig(
            dataset=r.dataset,
            agent=r.agent,
            reward_fn=r.reward_fn,
            group_size=e.samples,
            concurrency=concurrency,
            episode_timeout_s=e.episode_timeout_s or r.episode_timeout_s,
            max_tasks=len(tasks),
            seed=e.seed,
        )
        super().__init__(rollout, proxy_url, tasks, admin_key=admin_key, agent=agent)
        self.eval = e
        self.run_name = run
        self.metadata = metadata or {}
        self.order = _InOrder(tasks, run)

    def _group_body(self, task: dict[str, Any], group_id: str, size: int) -> dict[str, Any]:
        body = super()._group_body(task, group_id, size)
        body["metadata"] = {**body["metadata"], **self.metadata, "eval_run": self.run_name}
        body["seed"] = derive_seed(self.eval.seed, "eval", str(task["id"]))
        body["eval"] = True
        if self.eval.temperature is not None:
            body["temperature"] = self.eval.temperature
        return body


async def evaluate(
    cfg: Config,
    proxy_url: str,
    db: Database,
    run: str,
    *,
    tasks: list[dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
    agent: Callable[..., Any] | str | None = None,
    stop: asyncio.Event | None = None,
) -> dict[str, Any]:
    """Run evaluation `run` through the proxy at `proxy_url`, then report it from the store `db`. Setting
    `stop` ends it early: its open episodes fail as stopped, and the report says so (`stopped`)."""
    tasks = eval_tasks(cfg) if tasks is None else tasks
    started = time.time()
    runner = EvalRunner(cfg, proxy_url, tasks, run, admin_key=cfg.proxy.admin_key, metadata=metadata, agent=agent)
    await runner.run(stop)
    episodes = await db.aread(lambda c: eval_episodes(c, run))
    report = build_report(episodes, tasks, cfg.eval, run=run, metadata=metadata)
    report["seconds"] = round(time.time() - started, 3)
    report["stopped"] = bool(stop is not None and stop.is_set())
    return report
