"""Online RL: live traffic becomes trainable episodes once someone says how good the answers were.

An agent serving users points at the proxy and changes nothing. Its calls land in automatic
sessions: one per conversation root, or one per `X-Areal-Episode` header value. Whatever saw an
answer (the user's thumbs, an app's check, a later judge) posts feedback by the response id the
client got (`POST /feedback`), or rewards a session directly (`POST /sessions/{id}/reward`).

The sweeper here ends episodes. An open automatic episode idle for `idle_timeout_s` (no call, no
feedback) that carries a reward is finished on the rewards posted (their sum is its reward; returns
run back through its tree as for any episode) and the trainer may claim it. One nobody rewarded waits
until `reward_deadline_s` after its last activity, then is scored by `default_reward_fn` or dropped
(failed with the reason, counted). An episode whose every answer a resend superseded is dropped as
a duplicate. Feedback on an episode that has ended is refused (409): it was already scored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from proxy.config import OnlineConfig
from proxy.errors import conflict, invalid_request, not_found
from proxy.metrics import Metrics
from proxy.rewards_service import RewardService
from proxy.schemas.control import Feedback, Finish
from proxy.sessions import SessionService
from proxy.store.db import Database, StoreUnavailable
from proxy.store.online import IdleEpisode, completion_for_response, idle_episodes, release_episode_key
from proxy.store.sessions import get_session, touch_session
from proxy.store.turns import set_turn_reward

log = logging.getLogger("areal_proxy")

SWEEP_BATCH = 256
"""Idle episodes handled per sweep round; the rest wait for the next round."""


class OnlineEpisodes:
    def __init__(
        self, db: Database, sessions: SessionService, rewards: RewardService, cfg: OnlineConfig, metrics: Metrics
    ) -> None:
        self.db = db
        self.sessions = sessions
        self.rewards = rewards
        self.cfg = cfg
        self.metrics = metrics
        self.busy: Callable[[str], bool] = lambda session_id: False  # calls in flight (set once the engine is up)

    # -- feedback -------------------------------------------------------------------
    def reward_of(self, body: Feedback) -> float:
        if body.score is not None:
            return body.score
        if body.thumbs is not None:
            return self.cfg.thumbs_up if body.thumbs == "up" else self.cfg.thumbs_down
        assert body.label is not None
        if body.label not in self.cfg.labels:
            known = ", ".join(sorted(self.cfg.labels)) or "none are configured ([online] labels)"
            raise invalid_request(f"unknown feedback label {body.label!r}; known labels: {known}", "label")
        return self.cfg.labels[body.label]

    async def feedback(self, body: Feedback) -> dict[str, Any]:
        """Set the reward of the answer a response id names; its episode stays open until it is idle."""
        reward = self.reward_of(body)

        def op(conn: Any) -> dict[str, Any]:
            row = completion_for_response(conn, body.response_id, body.choice_index)
            if row is None:
                raise not_found(f"no recorded answer has response id {body.response_id!r}", "response_id")
            if row.eval:
                raise conflict(f"{body.response_id} belongs to an evaluation session, which is never trained on")
            # The session's row held (PostgreSQL) until commit: a sweep finishing it meanwhile sees this reward
            # or ends it first and this feedback is refused, never accepted and lost.
            status = get_session(conn, row.session_id, lock=True).status
            if status != "open":
                raise conflict(
                    f"the episode of {body.response_id} ({row.session_id}) has ended ({status}); "
                    "feedback must arrive before it is scored"
                )
            if row.superseded_by is not None:
                raise conflict(
                    f"{body.response_id} was superseded by the client's resend {row.superseded_by}; rate that one"
                )
            set_turn_reward(conn, row.session_id, row.id, reward)
            touch_session(conn, row.session_id, time.time())  # the episode ends idle_timeout_s after its feedback
            return {"session_id": row.session_id, "completion_id": row.id, "reward": reward}

        try:
            outcome = await self.db.write(op)
        except Exception as exc:
            self.metrics.inc("areal_feedback_total", outcome=getattr(exc, "code", None) or "error")
            raise
        self.metrics.inc("areal_feedback_total", outcome="accepted")
        return outcome

    # -- ending episodes ------------------------------------------------------------
    async def sweep(self, now: float) -> dict[str, int]:
        """End the idle episodes due now; counts by outcome."""
        idle_since = now - self.cfg.idle_timeout_s
        due = await self.db.aread(lambda c: idle_episodes(c, idle_since, SWEEP_BATCH))
        counts: dict[str, int] = {}
        for episode in due:
            if self.busy(episode.id):
                continue  # a call of it is being generated: not idle
            outcome = await self._end(episode, now)
            if outcome is not None:
                counts[outcome] = counts.get(outcome, 0) + 1
                self.metrics.inc("areal_online_episodes_total", outcome=outcome)
        return counts

    async def _end(self, episode: IdleEpisode, now: float) -> str | None:
        sid = episode.id
        try:
            if episode.live == 0:
                await self.rewards.fail(sid, "online: every answer was superseded by a client's resend")
                outcome = "superseded"
            elif episode.rewarded:
                result = await self.rewards.finish_with_feedback(sid)
                outcome = "rewarded" if result["status"] == "finished" else "failed"
            elif episode.updated_at > now - self.cfg.reward_deadline_s:
                return None  # ended, and still within the time feedback may come in
            elif self.cfg.default_reward_fn:
                result = await self.rewards.finish(sid, Finish(reward_fn=self.cfg.default_reward_fn))
                outcome = "default_reward" if result["status"] == "finished" else "failed"
            else:
                deadline = self.cfg.reward_deadline_s
                await self.rewards.fail(sid, f"online: no feedback within {deadline:.0f}s and no default_reward_fn")
                outcome = "dropped"
        except Exception as exc:  # noqa: BLE001 - ended concurrently (a 409) or a store fault: next round
            if getattr(exc, "status", None) != 409:
                log.warning("online episode %s not ended this round: %s", sid, exc)
            return None
        await self.db.write(lambda c: release_episode_key(c, sid))
        self.sessions.forget(sid)
        return outcome

    async def run(self) -> None:
        """The sweeper: every `sweep_interval_s`, until cancelled."""
        while True:
            await asyncio.sleep(self.cfg.sweep_interval_s)
            try:
                counts = await self.sweep(time.time())
            except StoreUnavailable as exc:
                log.warning("online sweep skipped: %s", exc)
                continue
            except Exception:  # the sweeper retries next round; serving goes on
                log.exception("online sweep failed")
                continue
            if counts:
                log.info("online episodes ended: %s", counts)
