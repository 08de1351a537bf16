"""Completion rows: recording a model call's turn, its rewards and returns, and reading chains.

`record_turn` writes every choice of one call together with its session's
counters (completions, oldest/newest weight version), creating an automatic
session with them when the call starts one: one statement on PostgreSQL. A named session
takes completions only while open: if another replica closed it meanwhile, the
counters update matches nothing and the caller rolls the turn back. Its statements run on the
driver's cursor (`proxy/store/driver.py`): they are every answered call's. `turn_recorded`
tells whether a turn whose COMMIT was cut off landed after all. Rewards are
raw per turn; returns are what `rewards/returns.py` computed over the tree.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, select, update

from proxy.store.driver import insert_rows_and_execute, insert_with_parents
from proxy.store.schema import completions, sessions
from proxy.store.sessions import auto_session_row


def record_turn(
    conn: Connection,
    session_id: str,
    rows: list[dict[str, Any]],
    now: float,
    versions: tuple[int, int] | None,
    *,
    new_auto_session: bool,
) -> bool:
    """Insert one call's completion rows and update their session; False if it was closed meanwhile.

    `versions` is the (oldest, newest) weight version of the sampled tokens, if any.
    """
    if new_auto_session:  # born with its first completions: one statement fewer
        lo, hi = versions if versions is not None else (None, None)
        session = {**auto_session_row(session_id, now), "num_completions": len(rows)}
        insert_with_parents(conn, sessions, [{**session, "min_version": lo, "max_version": hi}], completions, rows)
        return True
    return insert_rows_and_execute(conn, completions, rows, *_count_turn(session_id, len(rows), now, versions)) > 0


def _count_turn(session_id: str, n: int, now: float, versions: tuple[int, int] | None) -> tuple[str, tuple[Any, ...]]:
    """The UPDATE of a session's counters for `n` more completions, matching it only while it takes
    them (open, or automatic)."""
    params: list[Any] = [n, now]
    span = ""
    if versions is not None:
        lo, hi = versions
        span = (
            ", min_version = CASE WHEN min_version IS NULL OR min_version > ? THEN ? ELSE min_version END"
            ", max_version = CASE WHEN max_version IS NULL OR max_version < ? THEN ? ELSE max_version END"
        )
        params += [lo, lo, hi, hi]
    sql = (
        f"UPDATE sessions SET num_completions = num_completions + ?, updated_at = ?{span}"
        " WHERE id = ? AND (status = ? OR auto = ?)"
    )
    return sql, (*params, session_id, "open", True)


def turn_recorded(conn: Connection, completion_id: str) -> bool:
    """Whether a call's rows are stored (they are written together), by its first completion's id."""
    return conn.execute(select(completions.c.id).where(completions.c.id == completion_id)).first() is not None


def last_completion_id(conn: Connection, session_id: str) -> str | None:
    """The session's latest completion (choice 0 of the latest call) that no resend superseded."""
    row = conn.execute(
        select(completions.c.id)
        .where(completions.c.session_id == session_id, completions.c.superseded_by.is_(None))
        .order_by(completions.c.created_at.desc(), completions.c.choice_index, completions.c.id.desc())
        .limit(1)
    ).first()
    return row.id if row else None


def set_turn_reward(conn: Connection, session_id: str, completion_id: str, reward: float) -> bool:
    """Set one completion's raw reward; False if it is not in that session."""
    done = conn.execute(
        update(completions)
        .where(completions.c.id == completion_id, completions.c.session_id == session_id)
        .values(reward=reward)
    )
    return done.rowcount > 0


def turn_rewards(conn: Connection, session_id: str) -> list[Row]:
    """(id, parent_id, reward) of every completion in the session that no resend superseded: the tree
    returns are computed on."""
    query = select(completions.c.id, completions.c.parent_id, completions.c.reward).where(
        completions.c.session_id == session_id, completions.c.superseded_by.is_(None)
    )
    return list(conn.execute(query).all())


def set_rewards_and_returns(conn: Connection, values: dict[str, tuple[float | None, float]]) -> None:
    """completion id → (raw reward, tree return)."""
    for completion_id, (reward, ret) in values.items():
        conn.execute(update(completions).where(completions.c.id == completion_id).values(reward=reward, ret=ret))


def response_messages(conn: Connection, response_id: str, session_id: str | None) -> list[dict[str, Any]] | None:
    """The full conversation a recorded response ended (its reply included), or None.

    Only within `session_id`, or among automatic sessions when it is None.
    """
    row = conn.execute(
        select(completions.c.id, completions.c.session_id, sessions.c.auto)
        .join(sessions, sessions.c.id == completions.c.session_id)
        .where(completions.c.response_id == response_id, completions.c.choice_index == 0)
    ).first()
    if row is None or (row.session_id != session_id if session_id is not None else not row.auto):
        return None
    chain, current = [], row.id
    while current is not None:
        node = conn.execute(
            select(completions.c.parent_id, completions.c.request, completions.c.response).where(
                completions.c.id == current
            )
        ).one()
        chain.append(node)
        current = node.parent_id
    messages: list[dict[str, Any]] = []
    for node in reversed(chain):
        messages += [*node.request.get("messages", []), node.response]
    return messages
