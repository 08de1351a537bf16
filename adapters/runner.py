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

Which task runs next, whether a group is screened on its first samples, and whether a
group that earned nothing runs again are rollout strategies chosen in `[rollout]`
(`adapters/strategies.py`); every group samples from a seed derived from `rollout.seed`
and its group id, so a run's rollouts are reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from adapters.config import RolloutConfig
from adapters.groups import Group, NextGroup, RunnerStats
from adapters.strategies import strategies
from adapters.tasks import is_command, load_agent
from proxy.seeds import derive_seed

log = logging.getLogger("areal_runner")


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
        self._groups: dict[str, Group] = {}
        self._running: set[asyncio.Task] = set()
        self._slots = asyncio.Semaphore(cfg.concurrency)
        self._stop = asyncio.Event()
        saved = self._saved_state()
        self.stats.tasks_started = int(saved.get("tasks_started", 0))
        chosen = strategies(cfg, tasks, saved)
        self.order, self.screen, self.retry = chosen.order, chosen.screen, chosen.retry
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), headers=self.headers)

    def _saved_state(self) -> dict[str, Any]:
        if self.state_path and self.state_path.is_file():
            return json.loads(self.state_path.read_text())
        return {}

    def _save_position(self) -> None:
        if self.state_path:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"tasks_started": self.stats.tasks_started, **self.order.state()}))
            os.replace(tmp, self.state_path)

    def progress_rows(self) -> list[tuple[str, str]]:
        """Lines of the progress display for the strategies that are on."""
        return self.retry.rows(self.stats) + self.screen.rows(self.stats) + self.order.rows()

    def _new_group(self) -> NextGroup:
        task, group_id, kind = self.order.next(self.stats.tasks_started)
        size = self.cfg.group_size
        return NextGroup(task, group_id, size, self.screen.first(size), kind)

    # -- the run --------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> RunnerStats:
        stop = self._stop = stop or asyncio.Event()
        slots = self._slots
        running = self._running
        try:
            while not stop.is_set():
                plan = self.retry.next()
                if plan is None:
                    if self.cfg.max_tasks and self.stats.tasks_started >= self.cfg.max_tasks:
                        if not running:
                            break
                        await _first_done(running, stop)  # a group that ends may queue a retry
                        continue
                    if not self.tasks:
                        break
                    plan = self._new_group()
                # one group waits for free slots so it starts together; a screened group's held
                # sessions keep theirs, so the rest starts the moment the screen decides rather
                # than behind newer groups (its first sessions age with every training step)
                if not await _acquire(slots, plan.size, stop):
                    break  # stopped while the slots were busy: their episodes are cancelled below
                try:
                    group = await self._create_group(plan.task, plan.group_id, plan.size, stop)
                except BaseException:
                    for _ in range(plan.size):
                        slots.release()
                    raise
                if group is None:
                    for _ in range(plan.size):
                        slots.release()
                    break
                self._start(plan, group)
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

    def _start(self, plan: NextGroup, sessions: list[dict[str, Any]]) -> None:
        """Count a created group and run its first sessions; the rest are held for the screen."""
        first = plan.first
        if plan.retry:
            self.stats.hard_groups += 1
        else:
            self.stats.tasks_started += 1
            self.order.started(plan.kind)
            self._save_position()
        self._groups[plan.group_id] = Group(
            plan.task,
            plan.retry,
            left=len(sessions),
            held=sessions[first:],
            screening=first if first < plan.size else 0,
            kind=plan.kind,
        )
        self._open.update(s["session_id"] for s in sessions[first:])
        for session in sessions[:first]:
            self._spawn(self._episode(plan.task, plan.group_id, session, self._slots))

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._running.add(t)
        t.add_done_callback(self._running.discard)

    async def _create_group(
        self, task: dict[str, Any], group_id: str, size: int, stop: asyncio.Event
    ) -> list[dict] | None:
        body = self._group_body(task, group_id, size)
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

    def _group_body(self, task: dict[str, Any], group_id: str, size: int) -> dict[str, Any]:
        """The POST /sessions body that creates a task's group."""
        return {
            "count": size,
            "task_id": str(task["id"]),
            "group_id": group_id,
            "reward_fn": self.cfg.reward_fn or None,
            "reference": task.get("reference"),
            "metadata": task.get("metadata") or {},
            # Each group samples from its own seed: the run's rollouts are a function of its seeds.
            "seed": derive_seed(self.cfg.seed, group_id),
            **({"temperature": self.cfg.temperature} if self.cfg.temperature is not None else {}),
        }

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
        """Count the group down; decide a screened group; tell the strategies when it has ended."""
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
            self.order.ended(group)
            self.retry.ended(group_id, group)

    def _decide_screen(self, group_id: str, group: Group) -> None:
        """Run a screened group's held sessions if the screen lets them, else end them unrun."""
        held, group.held = group.held, []
        reason = self.screen.verdict(group.screen_rewards)
        if reason is None:
            for session in held:
                self._spawn(self._episode(group.task, group_id, session, self._slots))
            return
        self.stats.screened_out += 1
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
            start_new_session=True,  # its own process group: a timeout kills what it started too
        )
        try:
            _, err = await proc.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the shell and its children, which hold its pipes
            await proc.wait()  # reaped on this loop, before it closes
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


async def _acquire(slots: asyncio.Semaphore, n: int, stop: asyncio.Event) -> bool:
    """Take `n` slots, or none once `stop` is set: a run that ends (its last step, Ctrl-C) does
    not wait for an episode to free a slot, which an agent of long tool calls takes minutes to."""
    taken = 0
    while taken < n and not stop.is_set():
        acquiring = asyncio.ensure_future(slots.acquire())
        await _first_done({acquiring}, stop)
        if not acquiring.done():
            acquiring.cancel()  # a semaphore gives back a slot granted to a cancelled waiter
            with contextlib.suppress(asyncio.CancelledError):
                await acquiring
        if acquiring.done() and not acquiring.cancelled():
            taken += 1
    if taken < n:
        for _ in range(taken):
            slots.release()
        return False
    return True


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


def throughput(stats: RunnerStats, started: float) -> float:
    return stats.episodes_finished / max(time.time() - started, 1e-6)
