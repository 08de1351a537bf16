"""Session rows: creating, looking up, listing and closing episodes.

A session is one episode: open while its agent calls the model, then finished
(scored), failed, or claimed and consumed by the trainer (`claims.py`). The
services above (`proxy/sessions.py`, `proxy/rewards_service.py`, admission
control) decide what should happen; these operations are how it happens in SQL,
each on the caller's connection so several compose into one transaction. Rows
come back as SQLAlchemy rows with the column names of `schema.py`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, func, select, text, update

from proxy.store.schema import sessions

SESSION_STATUSES = ("open", "finished", "training", "consumed", "failed")
"""open → finished (scored) → training (claimed by a step whose weights are not pushed yet) →
consumed (trained, or dropped/skipped by the trainer); or failed."""

_ADMISSION_LOCK_ID = 0x41444D54  # "ADMT": held by one replica's count + insert at a time


def get_session(conn: Connection, session_id: str, *, lock: bool = False) -> Row | None:
    """One session row; `lock` holds it (FOR UPDATE on PostgreSQL) until the transaction ends."""
    query = select(sessions).where(sessions.c.id == session_id)
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return conn.execute(query).first()


def session_by_key_hash(conn: Connection, key_hash: str) -> Row | None:
    return conn.execute(select(sessions).where(sessions.c.key_hash == key_hash)).first()


def insert_sessions(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert session rows given by column name (`metadata`, not the ORM's `meta`)."""
    conn.execute(sessions.insert(), rows)


def auto_session_row(session_id: str, now: float) -> dict[str, Any]:
    """The row of an automatic session: one per conversation root of unnamed model calls."""
    return {
        "id": session_id,
        "key_hash": None,
        "task_id": None,
        "group_id": None,
        "metadata": {},
        "status": "open",
        "auto": True,
        "num_completions": 0,
        "created_at": now,
        "updated_at": now,
    }


def touch_session(conn: Connection, session_id: str, now: float) -> None:
    """Record activity, so that the idle sweeper leaves the session open."""
    conn.execute(update(sessions).where(sessions.c.id == session_id).values(updated_at=now))


def close_session(
    conn: Connection,
    session_id: str,
    *,
    status: str,
    now: float,
    reward: float | None = None,
    failure: str | None = None,
    finish_spec: dict[str, Any] | None = None,
) -> None:
    """End a session as `finished` or `failed`, with the fields given."""
    extra = {"reward": reward, "failure": failure, "finish_spec": finish_spec}
    values = {"status": status, "finished_at": now, "updated_at": now}
    values.update({k: v for k, v in extra.items() if v is not None})
    conn.execute(update(sessions).where(sessions.c.id == session_id).values(**values))


def fail_idle_sessions(
    conn: Connection, idle_since: float, failure: str, now: float, *, named_only: bool = False
) -> list[str]:
    """Fail open sessions (only named ones with `named_only`) with no activity since `idle_since`; their ids."""
    query = select(sessions.c.id).where(sessions.c.status == "open", sessions.c.updated_at < idle_since)
    if named_only:
        query = query.where(sessions.c.auto.is_(False))
    ids = [r.id for r in conn.execute(query)]
    if ids:
        conn.execute(
            update(sessions)
            .where(sessions.c.id.in_(ids), sessions.c.status == "open")
            .values(status="failed", failure=failure, finished_at=now, updated_at=now)
        )
    return ids


def touch_sessions(conn: Connection, ids: list[str], now: float) -> None:
    """Mark open sessions active now (a call of theirs is being generated)."""
    if ids:
        conn.execute(update(sessions).where(sessions.c.id.in_(ids), sessions.c.status == "open").values(updated_at=now))


def fail_open_sessions(conn: Connection, failure: str, now: float) -> int:
    """Fail every open named session (automatic ones stay open); how many."""
    done = conn.execute(
        update(sessions)
        .where(sessions.c.status == "open", sessions.c.auto.is_(False))
        .values(status="failed", failure=failure, finished_at=now)
    )
    return done.rowcount


def recent_sessions(
    conn: Connection, status: str | None, limit: int, offset: int = 0, *, evaluation: bool | None = None
) -> list[Row]:
    """Sessions, newest first, optionally of one status and only evaluation (or training) ones."""
    query = select(sessions).order_by(sessions.c.created_at.desc()).limit(limit).offset(offset)
    return list(conn.execute(_filtered(query, status, evaluation)).all())


def count_sessions(conn: Connection, status: str | None, *, evaluation: bool | None = None) -> int:
    query = select(func.count()).select_from(sessions)
    return int(conn.execute(_filtered(query, status, evaluation)).scalar() or 0)


def _filtered(query: Any, status: str | None, evaluation: bool | None) -> Any:
    if status:
        query = query.where(sessions.c.status == status)
    if evaluation is not None:
        query = query.where(sessions.c.eval.is_(evaluation))
    return query


def lock_admission(conn: Connection) -> None:
    """Serialize admission decisions across proxy replicas until the transaction ends.

    PostgreSQL takes an advisory lock; SQLite has one proxy process and serializes its writers.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _ADMISSION_LOCK_ID})


def unconsumed_count(conn: Connection) -> int:
    """Named training sessions not yet in the engine's weights: open, finished, or in a running step
    (evaluation sessions are never trained on, so they are never ahead of the trainer)."""
    query = (
        select(func.count())
        .select_from(sessions)
        .where(
            sessions.c.status.in_(("open", "finished", "training")),
            sessions.c.auto.is_(False),
            sessions.c.eval.is_(False),
        )
    )
    return int(conn.execute(query).scalar() or 0)
