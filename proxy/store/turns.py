"""Completion rows: recording a model call's turn, its rewards and returns, and reading chains.

`record_turn` writes every choice of one call together with its session's
counters (completions, oldest/newest weight version), creating an automatic
session in the same statement batch when the call starts one. A named session
takes completions only while open: if another replica closed it meanwhile, the
counters update matches nothing and the caller rolls the turn back. `turn_recorded`
tells whether a turn whose COMMIT was cut off landed after all. Rewards are
raw per turn; returns are what `rewards/returns.py` computed over the tree.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, case, or_, select, update

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
    lo, hi = versions if versions is not None else (None, None)
    if new_auto_session:  # born with its first completions: one statement fewer
        session = {**auto_session_row(session_id, now), "num_completions": len(rows)}
        conn.execute(sessions.insert(), [{**session, "min_version": lo, "max_version": hi}])
        conn.execute(completions.insert(), rows)
        return True
    conn.execute(completions.insert(), rows)
    values: dict[str, Any] = {"num_completions": sessions.c.num_completions + len(rows), "updated_at": now}
    if versions is not None:
        values["min_version"] = case(
            (sessions.c.min_version.is_(None), lo), (sessions.c.min_version > lo, lo), else_=sessions.c.min_version
        )
        values["max_version"] = case(
            (sessions.c.max_version.is_(None), hi), (sessions.c.max_version < hi, hi), else_=sessions.c.max_version
        )
    still_open = or_(sessions.c.status == "open", sessions.c.auto.is_(True))
    done = conn.execute(sessions.update().where(sessions.c.id == session_id, still_open).values(**values))
    return done.rowcount > 0


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
