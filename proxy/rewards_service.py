"""Rewarding and finishing sessions: the logic behind `/sessions/{id}/reward|finish`.

Finishing scores the episode — an inline reward, or a registered reward function
run on a read-only view of the session — adds that reward to the last
completion's raw reward (or a per-turn mapping to the turns it names; rewards
posted earlier stay), computes tree returns, and marks the session finished
with that score as its reward, all in one transaction that re-checks the status
under a row lock. A reward function that fails marks the session failed with
the reason. Finishing twice the same way answers the same result;
finishing differently is a 409.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sqlalchemy import Connection

from proxy.errors import conflict, invalid_request, not_found
from proxy.metrics import Metrics
from proxy.schemas.control import Finish
from proxy.sessions import SessionService
from proxy.store.db import Database
from proxy.store.online import posted_rewards
from proxy.store.sessions import close_session, get_session, touch_session
from proxy.store.tree import full_messages, session_rows
from proxy.store.turns import last_completion_id, set_rewards_and_returns, set_turn_reward, turn_rewards
from rewards.builtins import resolve_reward
from rewards.config import RewardsConfig
from rewards.returns import tree_returns
from rewards.scoring import RewardSlots, Score, score, validate
from rewards.session import CompletionView, SessionView


def session_view(session: Any, rows: list[Any]) -> SessionView:
    messages = full_messages(rows)
    views = tuple(
        CompletionView(
            id=r.id,
            parent_id=r.parent_id,
            messages=tuple(messages[r.id]),
            response=r.response,
            finish_reason=r.finish_reason,
            created_at=r.created_at,
        )
        for r in rows
    )
    return SessionView(
        session_id=session.id,
        task_id=session.task_id,
        group_id=session.group_id,
        reference=session.reference,
        metadata=dict(session.metadata or {}),
        completions=views,
    )


def _locked_session(conn: Connection, session_id: str) -> Any:
    row = get_session(conn, session_id, lock=True)
    if row is None:
        raise not_found(f"session {session_id!r} not found", "session_id")
    return row


class RewardService:
    def __init__(self, db: Database, sessions: SessionService, cfg: RewardsConfig, metrics: Metrics) -> None:
        self.db = db
        self.sessions = sessions
        self.cfg = cfg
        self.metrics = metrics
        self.slots = RewardSlots(cfg.max_workers)

    async def set_reward(self, session_id: str, reward: float, completion_id: str | None) -> dict[str, Any]:
        def op(conn: Connection) -> dict[str, Any]:
            session = _locked_session(conn, session_id)
            if session.status != "open":
                raise conflict(f"session {session_id} is {session.status}; rewards can no longer change")
            target = completion_id or last_completion_id(conn, session_id)
            if target is None:
                raise invalid_request(f"session {session_id} has no completions to reward", "completion_id")
            if not set_turn_reward(conn, session_id, target, reward):
                raise not_found(f"completion {target!r} is not in session {session_id}", "completion_id")
            # A posted reward is activity: the idle sweeper must not close this session under it.
            touch_session(conn, session_id, time.time())
            return {"session_id": session_id, "completion_id": target, "reward": reward}

        return await self.db.write(op)

    async def finish(self, session_id: str, body: Finish) -> dict[str, Any]:
        info = await self.sessions.get(session_id, fresh=True)
        inline, fn_name = body.reward, body.reward_fn
        if inline is not None and fn_name:
            raise invalid_request("give either reward or reward_fn, not both", "reward_fn")
        reference = info.reference if "reference" not in body.model_fields_set else body.reference
        reference = None if reference is None else str(reference)
        if inline is None and not fn_name:
            fn_name = info.reward_fn
            if not fn_name:
                raise invalid_request("finish needs a reward or a reward_fn (none was set at creation)", "reward")
        spec = {"reward": inline} if inline is not None else {"reward_fn": fn_name, "reference": reference}
        if info.status != "open":
            return await self._already_finished(session_id, spec)
        if inline is not None:
            result = Score(total=inline, per_completion=None)
        else:
            try:
                fn = resolve_reward(fn_name)
            except (KeyError, ValueError) as exc:
                raise invalid_request(str(exc.args[0] if exc.args else exc), "reward_fn") from None
            view = await self.db.aread(lambda c: self._view(c, session_id, reference))
            result = await score(fn, view, self.cfg.timeout_s, self.slots, name=fn_name)
        outcome = await self.db.write(lambda c: self._apply(c, session_id, spec, result))
        self.sessions.set_status(session_id, outcome["status"])
        self.metrics.inc("areal_sessions_finished_total", status=outcome["status"])
        return outcome

    async def finish_with_feedback(self, session_id: str) -> dict[str, Any]:
        """Finish an episode on the rewards posted on its turns (online feedback): its reward is their sum,
        its returns the tree's over them."""

        def op(conn: Connection) -> dict[str, Any]:
            total = sum(posted_rewards(conn, session_id))
            return self._apply(conn, session_id, {"feedback": True}, Score(total=total, per_completion={}))

        outcome = await self.db.write(op)
        self.sessions.set_status(session_id, outcome["status"])
        self.metrics.inc("areal_sessions_finished_total", status=outcome["status"])
        return outcome

    async def fail(self, session_id: str, reason: str) -> dict[str, Any]:
        def op(conn: Connection) -> dict[str, Any]:
            session = _locked_session(conn, session_id)
            if session.status != "open":
                raise conflict(f"session {session_id} is already {session.status}")
            close_session(conn, session_id, status="failed", failure=reason, now=time.time())
            return _summary(_locked_session(conn, session_id))

        outcome = await self.db.write(op)
        self.sessions.set_status(session_id, "failed")
        self.metrics.inc("areal_sessions_finished_total", status="failed")
        return outcome

    def _view(self, conn: Connection, session_id: str, reference: str | None) -> SessionView:
        session, rows = session_rows(conn, session_id)
        view = session_view(session, rows)
        return dataclasses.replace(view, reference=reference)

    async def _already_finished(self, session_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        session = await self.db.aread(lambda c: _locked_session(c, session_id))
        if session.finish_spec == spec:
            return _summary(session)
        raise conflict(
            f"session {session_id} is already {session.status} (finished with {session.finish_spec}); "
            f"a finish with {spec} conflicts"
        )

    def _apply(self, conn: Connection, session_id: str, spec: dict[str, Any], result: Score) -> dict[str, Any]:
        session = _locked_session(conn, session_id)
        if session.status != "open":
            if session.finish_spec == spec:
                return _summary(session)
            raise conflict(f"session {session_id} was finished concurrently with {session.finish_spec}")
        now = time.time()
        if result.error is not None:
            close_session(conn, session_id, status="failed", failure=result.error, finish_spec=spec, now=now)
            return _summary(_locked_session(conn, session_id))
        rows = turn_rewards(conn, session_id)
        raw = {r.id: r.reward for r in rows}
        if result.per_completion is not None:
            for cid, value in result.per_completion.items():
                raw[cid] = (raw.get(cid) or 0.0) + value
        else:
            last = last_completion_id(conn, session_id)
            if last is not None:
                raw[last] = (raw.get(last) or 0.0) + (result.total or 0.0)
        returns = tree_returns(((r.id, r.parent_id, raw[r.id]) for r in rows), self.cfg.discount, self.cfg.aggregate)
        set_rewards_and_returns(conn, {r.id: (raw[r.id], returns[r.id]) for r in rows})
        close_session(conn, session_id, status="finished", reward=result.total, finish_spec=spec, now=now)
        return _summary(_locked_session(conn, session_id))


def _summary(session: Any) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "status": session.status,
        "reward": session.reward,
        "failure": session.failure,
        "num_completions": session.num_completions,
    }


__all__ = ["RewardService", "session_view", "validate"]
