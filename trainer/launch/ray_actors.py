"""The Ray actors of `areal-proxy train --launcher ray`: a supervised process, and an episode runner.

`ProcessActor` runs one component — engine server, proxy replica, front or trainer — as a
child process of the actor, so the resources the actor was given apply to it (Ray sets
CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES in the actor, the child inherits them) and
it dies with the actor. It picks its port on its own node, keeps the child's log there, and
answers the launcher's health checks locally, so the launcher needs no network path to it.
`RunnerActor` runs an `EpisodeRunner` on its event loop over its share of the tasks.

Both are plain classes; the launcher wraps them with `ray.remote` and their resources.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from proxy.config import ADMIN_KEY_ENV
from trainer.launch.processes import free_port, stop_process

LOG_CHUNK = 1 << 20


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the actor process that started it dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def read_chunk(path: Path, offset: int) -> bytes:
    """Up to LOG_CHUNK bytes of `path` from `offset` (b"" when there is nothing new)."""
    if not path.is_file():
        return b""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(LOG_CHUNK)


class ProcessActor:
    """One `python -m ...` child process on a port of this node, restartable, with its log here."""

    def __init__(self, name: str, cwd: str, env: dict[str, str]) -> None:
        self.name = name
        self.env = env
        self.host = node_ip()
        self.port = free_port(self.host)
        self.dir = Path(tempfile.mkdtemp(prefix=f"areal-{name}-"))
        self.log = self.dir / f"{name}.log"
        self.config = self.dir / "config.json"
        self.cwd = cwd if Path(cwd).is_dir() else str(self.dir)
        self.argv: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def endpoint(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self, argv: list[str], config: dict[str, Any]) -> int:
        """Start `python argv... --config <config>`; `{host}` and `{port}` in argv are this actor's."""
        self.config.write_text(json.dumps(config, indent=2))
        self.argv = [a.format(host=self.host, port=self.port) for a in argv]
        return self._spawn()

    def _spawn(self) -> int:
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), **self.env}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        with open(self.log, "ab") as log:
            log.write(f"\n==> start {self.starts + 1}: {' '.join(self.argv)}\n".encode())
            self.proc = subprocess.Popen(
                [sys.executable, *self.argv, "--config", str(self.config)],
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self.starts += 1
        return self.proc.pid

    def set_env(self, env: dict[str, str]) -> None:
        """More environment for the child, from its next start (a trainer rank's place in its group)."""
        self.env = {**self.env, **env}

    def restart(self) -> int:
        self.stop(timeout=30)
        return self._spawn()

    def status(self) -> dict[str, Any]:
        code = self.proc.poll() if self.proc is not None else None
        return {"pid": self.proc.pid if self.proc else None, "returncode": code, "starts": self.starts}

    def healthy(self, path: str = "/health") -> bool:
        try:
            return httpx.get(f"http://{self.host}:{self.port}{path}", timeout=10, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout: float, path: str = "/health") -> str:
        """Empty once `path` answers 200; else why not (the child exited, or the time ran out)."""
        import time

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return f"{self.name} exited with {self.proc.returncode}"
            if self.healthy(path):
                return ""
            time.sleep(0.5)
        return f"{self.name} did not become healthy in {timeout:.0f}s"

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """An HTTP call to the child, from its own node."""
        key = self.env.get(ADMIN_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        url = f"http://{self.host}:{self.port}{path}"
        r = httpx.request(method, url, json=body, headers=headers, timeout=600, trust_env=False)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def mark(self, path: str, present: bool = True) -> None:
        """Create (or remove) a marker file on this node, e.g. the trainer's STOP file."""
        if present:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
        else:
            Path(path).unlink(missing_ok=True)

    def read_log(self, offset: int) -> bytes:
        return read_chunk(self.log, offset)

    def stop(self, timeout: float = 60) -> int | None:
        return stop_process(self.proc, timeout)


def shard(tasks: list[dict[str, Any]], k: int, n: int) -> list[dict[str, Any]]:
    """Runner k of n takes the tasks at positions i with i mod n = k: disjoint, together all of them."""
    return tasks[k::n]


def shard_limit(max_tasks: int, k: int, n: int) -> int | None:
    """Runner k's part of `max_tasks`, so that the parts add up to it; None when there is no limit."""
    return len(range(k, max_tasks, n)) if max_tasks > 0 else None


class RunnerActor:
    """An `EpisodeRunner` over runner k's share of the dataset, with its own saved position."""

    def __init__(self, name: str, cwd: str, env: dict[str, str]) -> None:
        self.name = name
        os.environ.update(env)
        if Path(cwd).is_dir():
            os.chdir(cwd)  # relative dataset / agent paths read as they do on the launching machine
        self.log = Path(tempfile.mkdtemp(prefix=f"areal-{name}-")) / f"{name}.log"
        handler = logging.FileHandler(self.log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        for noisy in ("httpx", "httpx2", "httpcore", "openai"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        self.runner: Any = None
        self.task: asyncio.Task | None = None
        self.stopping: asyncio.Event | None = None

    async def start(self, config: dict[str, Any], proxy_url: str, k: int, n: int, state_path: str) -> int:
        """Load the tasks, take share k of n, start running episodes; returns the share's size."""
        from adapters.runner import EpisodeRunner
        from adapters.tasks import load_tasks
        from proxy.config import Config

        cfg = Config.model_validate(config)
        rollout = cfg.rollout.model_copy()
        tasks = shard(await asyncio.to_thread(load_tasks, rollout.dataset, "train", rollout.seed), k, n)
        limit = shard_limit(rollout.max_tasks, k, n)
        if limit == 0:
            tasks = []  # fewer tasks than runners: this one has none
        rollout.max_tasks = limit or 0
        self.runner = EpisodeRunner(
            rollout, proxy_url, tasks, admin_key=cfg.proxy.admin_key, state_path=Path(state_path)
        )
        logging.getLogger("areal_runner").info("%s: %d tasks (share %d of %d)", self.name, len(tasks), k, n)
        self.stopping = asyncio.Event()
        self.task = asyncio.create_task(self.runner.run(self.stopping))
        return len(tasks)

    async def status(self) -> dict[str, Any]:
        stats = dataclasses.asdict(self.runner.stats) if self.runner is not None else {}
        stats.pop("recent_rewards", None)
        done = self.task is not None and self.task.done()
        error = None
        if done and not self.task.cancelled() and self.task.exception() is not None:
            error = repr(self.task.exception())
        return {**stats, "done": done, "error": error}

    async def stop(self, timeout: float = 60) -> None:
        """Stop starting episodes; those cut short end as failed sessions."""
        if self.stopping is None or self.task is None:
            return
        self.stopping.set()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except Exception:  # a stuck or failed runner must not block the shutdown
            self.task.cancel()

    def read_log(self, offset: int) -> bytes:
        return read_chunk(self.log, offset)
