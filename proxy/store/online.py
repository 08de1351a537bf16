"""Online episodes in SQL: episode headers, idle automatic episodes, feedback targets and resends.

Live traffic arrives as automatic sessions (one per conversation root, or one per `X-Areal-Episode`
header value, found by a hash of it kept in `key_hash` while the episode is open). These operations
are what `proxy/online.py` decides with: which open automatic episodes went idle and whether anyone
rewarded them, which completion a client's response id names, and which earlier completion a
resent request replaces.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, and_, exists, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import aliased

from proxy.store.schema import completions, sessions
from proxy.store.sessions import auto_session_row

EPISODE_HEADER = "x-areal-episode"
"""The request header naming a client's episode: its calls share one automatic session."""


def episode_key_hash(value: str) -> str:
    """Where an episode header's session is found: a hash no bearer key can have (keys are printable)."""
    return hashlib.sha256(b"\x00episode\x00" + value.encode()).hexdigest()


def open_episode(conn: Connection, key_hash: str) -> Row | None:
    """The open automatic session of an episode header, if any."""
    query = select(sessions).where(sessions.c.key_hash == key_hash, sessions.c.auto.is_(True))
    return conn.execute(query).first()


@dataclass(frozen=True)
class IdleEpisode:
    id: str
    updated_at: float
    rewarded: bool  # some live (not superseded) completion carries a reward
    live: int  # completions not superseded by a resend


def idle_episodes(conn: Connection, idle_since: float, limit: int) -> list[IdleEpisode]:
    """Open automatic training sessions with no activity since `idle_since`, oldest first."""
    live = completions.c.superseded_by.is_(None)
    query = (
        select(
            sessions.c.id,
            sessions.c.updated_at,
            func.count(completions.c.id).filter(live).label("live"),
            func.count(completions.c.reward).filter(live).label("rewarded"),
        )
        .select_from(sessions.outerjoin(completions, completions.c.session_id == sessions.c.id))
        .where(
            sessions.c.status == "open",
            sessions.c.auto.is_(True),
            sessions.c.eval.is_(False),
            sessions.c.updated_at < idle_since,
        )
        .group_by(sessions.c.id, sessions.c.updated_at)
        .order_by(sessions.c.updated_at, sessions.c.id)
        .limit(limit)
    )
    return [IdleEpisode(r.id, r.updated_at, r.rewarded > 0, r.live) for r in conn.execute(query)]


def join_episode(conn: Connection, session_id: str, key_hash: str, now: float) -> str:
    """The id of the episode header's open session, created as `session_id` unless another call (on any
    replica) created it first: the insert does nothing on a key hash already taken."""
    row = {**auto_session_row(session_id, now), "key_hash": key_hash}
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    conn.execute(dialect_insert(sessions).values(**row).on_conflict_do_nothing(index_elements=["key_hash"]))
    found = open_episode(conn, key_hash)
    assert found is not None  # inserted now or by the call that won
    return found.id


def release_episode_key(conn: Connection, session_id: str) -> None:
    """An ended episode's header no longer finds it: the next call with that header starts a new one."""
    conn.execute(update(sessions).where(sessions.c.id == session_id).values(key_hash=None))


def completion_for_response(conn: Connection, response_id: str, choice_index: int) -> Row | None:
    """(completion id, session id, status, auto, eval) of the choice a client's response id names."""
    query = (
        select(
            completions.c.id,
            completions.c.session_id,
            completions.c.superseded_by,
            sessions.c.status,
            sessions.c.auto,
            sessions.c.eval,
        )
        .join(sessions, sessions.c.id == completions.c.session_id)
        .where(completions.c.response_id == response_id, completions.c.choice_index == choice_index)
    )
    return conn.execute(query).first()


def supersede_resends(
    conn: Connection,
    *,
    request_hash: str,
    parent_id: str | None,
    session_id: str | None,
    since: float,
    by: str,
) -> list[str]:
    """Mark earlier completions of the same request as superseded by `by`; their ids.

    The same request means the same conversation prefix (`request_hash`) under the same parent; for a
    root with no session to scope it (`session_id` None) any automatic training session's root counts.
    Only completions made since `since` that nothing continues yet: a client that timed out and sent
    the request again continues from the answer it got, the later one.
    """
    child = aliased(completions)
    query = select(completions.c.id).where(
        completions.c.request_hash == request_hash,
        completions.c.created_at >= since,
        completions.c.superseded_by.is_(None),
        ~exists().where(child.c.parent_id == completions.c.id),
    )
    if parent_id is not None:
        query = query.where(completions.c.parent_id == parent_id)
    else:
        query = query.where(completions.c.parent_id.is_(None))
    if session_id is not None:
        query = query.where(completions.c.session_id == session_id)
    else:
        query = query.join(sessions, sessions.c.id == completions.c.session_id).where(
            and_(sessions.c.auto.is_(True), sessions.c.eval.is_(False), sessions.c.status == "open")
        )
    ids = [r.id for r in conn.execute(query)]
    if ids:
        conn.execute(update(completions).where(completions.c.id.in_(ids)).values(superseded_by=by))
    return ids


def posted_rewards(conn: Connection, session_id: str) -> list[float]:
    """The rewards posted on a session's live completions."""
    query = select(completions.c.reward).where(
        completions.c.session_id == session_id,
        completions.c.superseded_by.is_(None),
        completions.c.reward.is_not(None),
    )
    return [float(r.reward) for r in conn.execute(query)]


def online_counts(conn: Connection) -> dict[str, Any]:
    """Automatic training episodes by status, and completions superseded by resends."""
    rows = conn.execute(
        select(sessions.c.status, func.count())
        .where(sessions.c.auto.is_(True), sessions.c.eval.is_(False))
        .group_by(sessions.c.status)
    ).all()
    superseded = conn.execute(select(func.count()).where(completions.c.superseded_by.is_not(None))).scalar()
    return {"episodes": {status: n for status, n in rows}, "superseded_completions": int(superseded or 0)}
