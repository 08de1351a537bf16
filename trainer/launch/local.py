"""`areal-proxy train` on one machine: proxy, episode runner and trainer together.

The proxy (with its engine, admission control on) and the trainer run as child
processes reading one effective config written to the run directory; the episode
runner runs here, on the event loop, next to a rich progress display fed by the
trainer's metrics file. The run ends when the trainer reaches `max_steps` or the
dataset is used up and trained; Ctrl-C stops the runner, lets the trainer
checkpoint, and stops the proxy. Running the same command again resumes: the
trainer from its last checkpoint, the runner from its saved dataset position;
sessions left open by the interrupted run are closed as failed.

`--online` runs the proxy and the trainer without a runner: the user's own agent sends live traffic,
whatever sees the answers posts feedback, and the proxy's online sweeper (`proxy/online.py`) turns
rewarded idle episodes into finished sessions the trainer claims as usual.

With `trainer.processes` > 1 the trainer is that many processes (torch.distributed ranks on this
machine, `trainer/distributed.py`); if one dies the others are killed (a sharded step or save
needs every rank) and the next start resumes from the last checkpoint, with any process count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from adapters.runner import EpisodeRunner
from adapters.tasks import load_tasks
from proxy.config import ADMIN_KEY_ENV, Config, public_config
from proxy.store.db import Database
from proxy.store.online import online_counts
from proxy.store.sessions import fail_open_sessions
from trainer.config import RunningMeanConfig
from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy, write_private
from trainer.loop import PROXY_START_S, WAIT_FOR_ENV, proxy_url
from trainer.metrics import progress_rows


def close_interrupted_sessions(cfg: Config) -> int:
    """Sessions an earlier, interrupted run left open can never finish: fail them."""
    db = Database(cfg.store)
    try:
        return db.transaction(lambda c: fail_open_sessions(c, "interrupted: the run was stopped", time.time()))
    finally:
        db.close()


class Children:
    """The proxy and trainer processes of a run."""

    def __init__(self, run_dir: Path, config_file: Path, admin_key: str) -> None:
        self.run_dir = run_dir
        self.config_file = config_file
        self.procs: dict[str, subprocess.Popen] = {}
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if admin_key:
            env[ADMIN_KEY_ENV] = admin_key  # the config file the children read holds no key
        self.env = env

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        argv = [sys.executable, *args, "--config", str(self.config_file)]
        proc = start_process(argv, self.run_dir / f"{name}.log", env=self.env)
        self.procs[name] = proc
        (self.run_dir / f"{name}.pid").write_text(str(proc.pid))
        return proc

    def stop(self, name: str, timeout: float = 60) -> int | None:
        return stop_process(self.procs.get(name), timeout)

    def start_trainers(self, processes: int) -> list[subprocess.Popen]:
        """The trainer's ranks: rank 0 as `trainer` (its log trainer.log), rank r as `trainer.rank{r}`."""
        if processes == 1:
            return [self.start("trainer", ["-m", "trainer.loop"])]
        port = str(free_port())
        ranks = []
        for rank in range(processes):
            env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(processes)}
            self.env.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            ranks.append(self.start("trainer" if rank == 0 else f"trainer.rank{rank}", ["-m", "trainer.loop"]))
        return ranks

    def stop_trainers(self, ranks: list[subprocess.Popen], timeout: float) -> int | None:
        """Rank 0 is asked to stop (it checkpoints, with the others, and tells them to exit); if a rank
        is already dead nothing collective can finish, so the rest are killed (rank 0 gone with an
        error included: the others ignore SIGTERM, which is rank 0's to act on). The first failure's code."""
        if any(p.poll() is not None for p in ranks[1:]) or ranks[0].poll() not in (0, None):
            for p in ranks:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        codes = [stop_process(ranks[0], timeout)] + [stop_process(p, 60) for p in ranks[1:]]
        return next((c for c in codes if c not in (0, None)), codes[0])


def _trainer_table(title: str, cfg: Config, run_dir: Path) -> Table:
    """The live table's frame and the trainer's rows (from its metrics file); each mode adds its own."""
    table = Table(title=f"{title} — {run_dir}", show_header=False, min_width=60)
    table.add_column(style="bold")
    table.add_column()
    for row in progress_rows(run_dir, cfg.trainer.max_steps):
        table.add_row(*row)
    return table


def _stop_on_signals() -> asyncio.Event:
    """An event Ctrl-C or SIGTERM sets (where the loop can take signal handlers)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    return stop


def _trainer_code(trainers: list[subprocess.Popen]) -> int:
    """The first failed trainer process's exit code, else 0."""
    codes = [t.poll() for t in trainers]
    return next((c for c in codes if c not in (0, None)), 0)


def progress_table(cfg: Config, run_dir: Path, runner: EpisodeRunner, started: float) -> Table:
    table = _trainer_table("areal-proxy train", cfg, run_dir)
    s = runner.stats
    elapsed = max(time.time() - started, 1e-6)
    table.add_row("episodes finished / failed", f"{s.episodes_finished} / {s.episodes_failed}")
    table.add_row("episodes/s", f"{s.episodes_finished / elapsed:.2f}")
    table.add_row("admission waits", str(s.admission_waits))
    for row in runner.progress_rows():
        table.add_row(*row)
    table.add_row("elapsed", f"{elapsed:.0f}s")
    return table


def prepare_online(cfg: Config, console: Console) -> None:
    """`train --online`: the proxy ends idle episodes and takes feedback ([online]); live traffic is never
    refused (a user is waiting), so admission control is off and staleness is bounded by the claim's drop;
    episodes come one at a time, so without a critic the baseline is a running mean."""
    cfg.online.enabled = True
    cfg.proxy.admission = False
    if cfg.trainer.running_mean is None and cfg.trainer.critic is None and cfg.trainer.algorithm == "ppo":
        cfg.trainer.running_mean = RunningMeanConfig()
        console.print("online: episodes have no groups; baseline = [trainer.running_mean] key = 'prompt'")


def launch(cfg: Config, config_path: str | None, online: bool = False) -> int:
    run_dir = Path(cfg.trainer.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.proxy.port == 0:
        cfg.proxy.port = free_port()
    console = Console()
    if online:
        prepare_online(cfg, console)
    else:
        cfg.proxy.admission = True
    config_file = run_dir / "config.json"
    write_private(config_file, json.dumps(public_config(cfg), indent=2))
    (run_dir / "STOP").unlink(missing_ok=True)
    interrupted = close_interrupted_sessions(cfg)
    if interrupted:
        console.print(f"closed {interrupted} sessions left open by an interrupted run")
    tasks = None if online else load_tasks(cfg.rollout.dataset, "train", cfg.rollout.seed)
    children = Children(run_dir, config_file, cfg.proxy.admin_key)
    url = proxy_url(cfg)
    trainers: list[subprocess.Popen] = []
    proxy = children.start("proxy", ["-m", "proxy.cli", "serve"])
    try:
        # The trainers start now and wait for the proxy's health before they touch the store or the model
        # (the proxy migrates the one and converts the other): their imports overlap the proxy's start.
        children.env[WAIT_FOR_ENV] = url
        trainers = children.start_trainers(cfg.trainer.processes)
        wait_healthy(url, proxy, timeout=PROXY_START_S, log_path=run_dir / "proxy.log")
        console.print(f"web UI: {url}/ui/")
        if tasks is None:
            console.print(f"online: point your agent at {url}/v1 and post feedback to {url}/feedback")
            code = asyncio.run(_supervise_online(cfg, run_dir, trainers, console))
        else:
            runner = EpisodeRunner(
                cfg.rollout, url, tasks, admin_key=cfg.proxy.admin_key, state_path=run_dir / "runner_state.json"
            )
            code = asyncio.run(_supervise(cfg, run_dir, runner, trainers, console))
    except KeyboardInterrupt:
        code = 130
    finally:
        trainer_code = children.stop_trainers(trainers, timeout=300) if trainers else None
        children.stop("proxy")
    if code == 0 and trainer_code not in (0, None):
        code = trainer_code
    console.print(f"run finished (exit {code}); metrics: {run_dir / 'metrics.jsonl'}")
    return code


async def _supervise(
    cfg: Config, run_dir: Path, runner: EpisodeRunner, trainers: list[subprocess.Popen], console: Console
) -> int:
    stop = _stop_on_signals()
    started = time.time()
    rollout = asyncio.create_task(runner.run(stop))
    interactive = console.is_terminal
    with (
        Live(progress_table(cfg, run_dir, runner, started), console=console, refresh_per_second=1, transient=False)
        if interactive
        else contextlib.nullcontext() as live
    ):
        last_print = 0.0
        interrupted = False
        while True:
            await asyncio.sleep(1.0)
            if live is not None:
                live.update(progress_table(cfg, run_dir, runner, started))
            elif time.time() - last_print > 30:
                console.print(progress_table(cfg, run_dir, runner, started))
                last_print = time.time()
            if any(t.poll() is not None for t in trainers):  # done, or one rank died: the others stop too
                break
            if stop.is_set():
                interrupted = True
                break
            if rollout.done():
                (run_dir / "STOP").touch()  # the trainer ends once nothing more can be claimed
    stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(rollout, 60)
    (run_dir / "STOP").unlink(missing_ok=True)
    if interrupted:
        return 130
    return _trainer_code(trainers)


def online_table(cfg: Config, run_dir: Path, counts: dict, started: float) -> Table:
    table = _trainer_table("areal-proxy train --online", cfg, run_dir)
    episodes = counts.get("episodes", {})
    table.add_row("episodes open / finished", f"{episodes.get('open', 0)} / {episodes.get('finished', 0)}")
    trained = episodes.get("consumed", 0) + episodes.get("training", 0)
    table.add_row("episodes claimed / dropped", f"{trained} / {episodes.get('failed', 0)}")
    table.add_row("answers superseded by resends", str(counts.get("superseded_completions", 0)))
    table.add_row("elapsed", f"{time.time() - started:.0f}s")
    return table


async def _supervise_online(cfg: Config, run_dir: Path, trainers: list[subprocess.Popen], console: Console) -> int:
    """Until the trainer ends (trainer.max_steps / max_minutes) or Ctrl-C: a progress table of the live episodes."""
    stop = _stop_on_signals()
    started = time.time()
    db = Database(cfg.store)
    last_print = 0.0
    try:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)
            if any(t.poll() is not None for t in trainers):
                break
            if time.time() - last_print > (5 if console.is_terminal else 30):
                counts = await asyncio.to_thread(db.read, online_counts)
                console.print(online_table(cfg, run_dir, counts, started))
                last_print = time.time()
    finally:
        db.close()
    if stop.is_set():
        return 130
    return _trainer_code(trainers)
