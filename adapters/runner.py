"""The episode runner: dataset → sessions → the user's agent → reward → finish.

For each task it creates one group of `group_size` sessions in a single request
(so admission control admits or refuses a whole group), then runs the agent once
per session — in-process (`async def run(task, base_url, api_key)`) or as a
subprocess with the session's URL and key in its environment — with a
concurrency limit and a per-episode timeout. A finished episode is scored by the
proxy (`finish` with the session's reward function); an agent that raises, exits
non-zero or times out ends its session as failed without stopping the run. A 429
from admission control is retried after its Retry-After. Progress (tasks
started) is saved so a restarted run continues where it stopped.

With `hard_group_size` set, a task whose whole group earned no reward is queued
to run once more, ahead of new tasks, as one larger group: with a success rate of
a few percent a group of 8 rarely holds the single success that GRPO needs to
learn anything from a prompt, and a group of 32 often does.

With `screen_size = k`, a group is screened before it is spent (SPEED, Zhang et al.
2025, arXiv 2506.09016): all `group_size` sessions are created (so the group can
not be claimed in part), the agent runs on the first k, and the rest run only if
those k rewards differ. A group whose first k rewards are all equal (a prompt the
policy always fails or always solves) would almost surely be a zero-variance group,
which GRPO skips; its other sessions are ended unrun, as failed with the reason
"screened out", and the generation they would have cost goes to other prompts.

With `balance_by` naming a task field, the next task's kind (that field's value) is drawn so
that every kind yields about as many groups with reward variance, or (`balance_goal = "signal"`)
so that rollouts go to the kinds whose groups have it (`adapters/balance.py`); each kind's tasks
run in their own shuffled order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from adapters.balance import KindBalancer
from adapters.tasks import is_command, load_agent
from proxy.config import RolloutConfig
from proxy.seeds import derive_seed

log = logging.getLogger("areal_runner")


@dataclass
class RunnerStats:
    tasks_started: int = 0
    episodes_started: int = 0
    episodes_finished: int = 0
    episodes_failed: int = 0
    admission_waits: int = 0
    hard_groups: int = 0
    screened_out: int = 0  # groups ended after their first screen_size episodes
    reward_sum: float = 0.0
    recent_rewards: list[float] = field(default_factory=list)
    tasks_by_kind: dict[str, int] = field(default_factory=dict)  # balance_by: started per kind = each kind's position

    def record(self, reward: float | None) -> None:
        if reward is None:
            return
        self.reward_sum += reward
        self.recent_rewards = (self.recent_rewards + [reward])[-256:]


@dataclass
class _Group:
    task: dict[str, Any]
    retry: bool
    left: int  # sessions not yet ended
    held: list[dict[str, Any]] = field(default_factory=list)  # created, not run until the screen decides
    screening: int = 0  # screen episodes still running
    screen_rewards: set[float] = field(default_factory=set)
    rewards: set[float] = field(default_factory=set)  # distinct rewards of its ended sessions
    kind: str | None = None  # the task's balance_by value

    @property
    def earned(self) -> bool:
        """Some session scored above 0."""
        return any(r > 0 for r in self.rewards)


class EpisodeRunner:
    def __init__(
        self,
        cfg: RolloutConfig,
        proxy_url: str,
        tasks: list[dict[str, Any]],
        *,
        admin_key: str = "",
        state_path: Path | None = None,
        agent: Callable[..., Any] | str | None = None,
    ) -> None:
        self.cfg = cfg
        self.proxy_url = proxy_url.rstrip("/")
        self.tasks = tasks
        self.headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.state_path = state_path
        spec = agent if agent is not None else cfg.agent
        self.command = spec if isinstance(spec, str) and is_command(spec) else None
        self.agent = None if self.command else (spec if callable(spec) else load_agent(spec))
        self.stats = RunnerStats()
        self._open: set[str] = set()
        self._groups: dict[str, _Group] = {}
        self._hard: deque[tuple[dict[str, Any], str]] = deque()  # (task, group id) to retry
        self._running: set[asyncio.Task] = set()
        self._slots = asyncio.Semaphore(cfg.concurrency)
        self._stop = asyncio.Event()
        saved = self._saved_state()
        self.stats.tasks_started = int(saved.get("tasks_started", 0))
        self.balancer: KindBalancer | None = None
        if cfg.balance_by:
            self._init_kinds(saved.get("kind_positions", {}))
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), headers=self.headers)

    def _saved_state(self) -> dict[str, Any]:
        if self.state_path and self.state_path.is_file():
            return json.loads(self.state_path.read_text())
        return {}

    def _save_position(self) -> None:
        if self.state_path:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            state: dict[str, Any] = {"tasks_started": self.stats.tasks_started}
            if self.balancer is not None:
                state["kind_positions"] = self.stats.tasks_by_kind
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.state_path)

    def _init_kinds(self, positions: dict[str, int]) -> None:
        key = self.cfg.balance_by
        missing = [str(t.get("id")) for t in self.tasks if key not in t]
        if missing:
            raise ValueError(
                f"rollout.balance_by = {key!r}, but {len(missing)} tasks have no {key!r} field "
                f"(first: {missing[0]}); add it to every task or leave balance_by empty"
            )
        self._kind_order: dict[str, list[int]] = {}
        for i, task in enumerate(self.tasks):
            self._kind_order.setdefault(str(task[key]), []).append(i)
        for k, order in enumerate(self._kind_order.values()):
            random.Random(self.cfg.seed * 1000 + k).shuffle(order)
        self.stats.tasks_by_kind = {kind: int(positions.get(kind, 0)) for kind in self._kind_order}
        started = sum(self.stats.tasks_by_kind.values())
        self.balancer = KindBalancer(
            sorted(self._kind_order),
            seed=self.cfg.seed + started,
            floor=self.cfg.balance_floor,
            goal=self.cfg.balance_goal,
            sizes={kind: len(order) for kind, order in self._kind_order.items()},
        )

    def _next_task(self, order: list[int]) -> tuple[dict[str, Any], str, str | None]:
        """The next new task, its group id (unique per pass over the data) and its kind."""
        n = self.stats.tasks_started
        if self.balancer is None:
            task = self.tasks[order[n % len(order)]]
            return task, f"{task['id']}@{n // len(order)}", None
        kind = self.balancer.choose()
        indices, i = self._kind_order[kind], self.stats.tasks_by_kind[kind]  # moved on once the group is created
        task = self.tasks[indices[i % len(indices)]]
        return task, f"{task['id']}@{i // len(indices)}", kind

    # -- the run --------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> RunnerStats:
        stop = self._stop = stop or asyncio.Event()
        slots = self._slots
        running = self._running
        order = list(range(len(self.tasks)))
        random.Random(self.cfg.seed).shuffle(order)
        try:
            while not stop.is_set():
                retry = bool(self._hard)
                kind = None
                if retry:
                    task, first_try = self._hard.popleft()
                    group_id, size = f"{first_try}+hard", self.cfg.hard_group_size
                else:
                    n = self.stats.tasks_started
                    if self.cfg.max_tasks and n >= self.cfg.max_tasks:
                        if not running:
                            break
                        await _first_done(running, stop)  # a group that ends may queue a retry
                        continue
                    if not self.tasks:
                        break
                    task, group_id, kind = self._next_task(order)
                    size = self.cfg.group_size
                # one group waits for free slots so it starts together; a screened group's held
                # sessions keep theirs, so the rest starts the moment the screen decides rather
                # than behind newer groups (its first sessions age with every training step)
                for _ in range(size):
                    await slots.acquire()
                try:
                    group = await self._create_group(task, group_id, size, stop)
                except BaseException:
                    for _ in range(size):
                        slots.release()
                    raise
                if group is None:
                    for _ in range(size):
                        slots.release()
                    break
                first = size if retry or not self.cfg.screen_size else self.cfg.screen_size
                if retry:
                    self.stats.hard_groups += 1
                else:
                    self.stats.tasks_started += 1
                    if kind is not None:
                        self.stats.tasks_by_kind[kind] += 1
                    self._save_position()
                self._groups[group_id] = _Group(
                    task, retry, left=len(group), held=group[first:], screening=first if first < size else 0, kind=kind
                )
                self._open.update(s["session_id"] for s in group[first:])
                for session in group[:first]:
                    self._spawn(self._episode(task, group_id, session, slots))
            while running and not stop.is_set():  # an ending episode may start a group's held ones
                await asyncio.gather(*list(running), return_exceptions=True)
        finally:
            for t in list(running):
                t.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            for sid in list(self._open):  # episodes cut short by the stop: end them, do not leave them open
                await self._end(sid, "fail", {"reason": "stopped: the run ended before the episode did"})
            await self._http.aclose()
        return self.stats

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._running.add(t)
        t.add_done_callback(self._running.discard)

    async def _create_group(
        self, task: dict[str, Any], group_id: str, size: int, stop: asyncio.Event
    ) -> list[dict] | None:
        body = {
            "count": size,
            "task_id": str(task["id"]),
            "group_id": group_id,
            "reward_fn": self.cfg.reward_fn or None,
            "reference": task.get("reference"),
            "metadata": task.get("metadata") or {},
            # Each group samples from its own seed: the run's rollouts are a function of its seeds.
            "seed": derive_seed(self.cfg.seed, group_id),
        }
        delay = 0.5
        while not stop.is_set():
            try:
                r = await self._http.post(f"{self.proxy_url}/sessions", json=body)
            except httpx.TransportError as exc:
                log.warning("proxy unreachable (%s); retrying", exc)
                await _sleep_or_stop(stop, delay)
                delay = min(delay * 2, 10)
                continue
            if r.status_code == 201:
                return r.json()["data"]
            if r.status_code in (429, 503):
                self.stats.admission_waits += 1
                wait = float(r.headers.get("retry-after", 1))
                await _sleep_or_stop(stop, min(wait, 5.0))
                continue
            raise RuntimeError(f"POST /sessions failed: {r.status_code} {r.text}")
        return None

    async def _episode(
        self, task: dict[str, Any], group_id: str, session: dict[str, Any], slots: asyncio.Semaphore
    ) -> None:
        self.stats.episodes_started += 1
        sid = session["session_id"]
        self._open.add(sid)
        reward = None
        try:
            try:
                await asyncio.wait_for(self._call_agent(task, session), self.cfg.episode_timeout_s)
            except TimeoutError:
                await self._end(sid, "fail", {"reason": f"episode timed out after {self.cfg.episode_timeout_s:g}s"})
                return
            except Exception as exc:  # the user's agent crashed: that session fails, the run goes on
                log.info("agent failed in %s: %s", sid, exc)
                await self._end(sid, "fail", {"reason": f"agent error: {type(exc).__name__}: {exc}"[:2000]})
                return
            result = await self._end(sid, "finish", {})
            if result and result.get("status") == "finished":
                self.stats.episodes_finished += 1
                reward = result.get("reward")
                self.stats.record(reward)
            else:
                self.stats.episodes_failed += 1
        finally:
            slots.release()
            self._episode_ended(group_id, reward)

    def _episode_ended(self, group_id: str, reward: float | None) -> None:
        """Count the group down; decide a screened group; queue a retry if it ended without any reward."""
        group = self._groups.get(group_id)
        if group is None:  # two tasks with one id share a group; the first to end it counted it
            return
        group.left -= 1
        if reward is not None:
            group.rewards.add(reward)
        if group.screening:
            group.screening -= 1
            if reward is not None:
                group.screen_rewards.add(reward)
            if group.screening == 0 and not self._stop.is_set():  # stopping: the run ends what is open
                self._decide_screen(group_id, group)
        if group.left == 0:
            del self._groups[group_id]
            if self.balancer is not None and group.kind is not None:
                self.balancer.record(group.kind, group.rewards)
            if self.cfg.hard_group_size and not group.retry and not group.earned:
                self._hard.append((group.task, group_id))

    def _decide_screen(self, group_id: str, group: _Group) -> None:
        """Run a screened group's held sessions if its screen scored differently, else end them unrun."""
        held, group.held = group.held, []
        if len(group.screen_rewards) > 1:  # the prompt can go either way: run the rest
            for session in held:
                self._spawn(self._episode(group.task, group_id, session, self._slots))
            return
        self.stats.screened_out += 1
        k = self.cfg.screen_size
        reason = (
            f"screened out: the group's first {k} episodes all scored {next(iter(group.screen_rewards)):g}"
            if group.screen_rewards
            else f"screened out: the group's first {k} episodes all failed"
        )
        for session in held:
            self._slots.release()
            self._spawn(self._end(session["session_id"], "fail", {"reason": reason}, counted=False))
        group.left -= len(held)

    async def _call_agent(self, task: dict[str, Any], session: dict[str, Any]) -> None:
        if self.agent is not None:
            await self.agent(task, session["base_url"], session["api_key"])
            return
        env = {
            **os.environ,
            "OPENAI_BASE_URL": session["base_url"],
            "OPENAI_API_KEY": session["api_key"],
            "ANTHROPIC_BASE_URL": session["base_url"].removesuffix("/v1"),
            "ANTHROPIC_API_KEY": session["api_key"],
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
            "AREAL_TASK": json.dumps(task),
        }
        proc = await asyncio.create_subprocess_shell(
            self.command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await proc.communicate()
        except asyncio.CancelledError:
            proc.kill()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"agent command exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")

    async def _end(
        self, session_id: str, action: str, body: dict[str, Any], counted: bool = True
    ) -> dict[str, Any] | None:
        self._open.discard(session_id)
        if action == "fail" and counted:
            self.stats.episodes_failed += 1
        for attempt in range(5):
            try:
                r = await self._http.post(f"{self.proxy_url}/sessions/{session_id}/{action}", json=body)
            except httpx.TransportError:
                await asyncio.sleep(1 + attempt)
                continue
            if r.status_code == 200:
                return r.json()
            if r.status_code == 409:  # already ended (e.g. timed out by the proxy)
                return None
            if r.status_code in (502, 503, 504):  # a proxy replica failed under it: ending again is safe
                await asyncio.sleep(float(r.headers.get("retry-after", 1 + attempt)))
                continue
            log.warning("%s %s: %s %s", action, session_id, r.status_code, r.text[:300])
            return None
        return None


async def _first_done(running: set[asyncio.Task], stop: asyncio.Event) -> None:
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({*running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


def throughput(stats: RunnerStats, started: float) -> float:
    return stats.episodes_finished / max(time.time() - started, 1e-6)
