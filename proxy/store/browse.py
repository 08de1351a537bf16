"""Reading the store for the web UI: filtered pages of sessions, a group, a training step's batch.

Pages are keyset-paged, newest first, on `(created_at, id)`: a page is the `limit` rows below (or
above) the last row the reader saw, found by an index range scan (migration 0006), so the millionth
row costs what the first does, where OFFSET would read every row before it. Counting every match
on each page load would cost a full scan of a large store on PostgreSQL, so counts stop at a cap
and the UI says "10,000+". Only the columns a reader may see are selected: never a session's key
hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, func, select, tuple_

from proxy.store.schema import completions, sessions

SUMMARY_COLUMNS = (
    sessions.c.id,
    sessions.c.status,
    sessions.c.task_id,
    sessions.c.group_id,
    sessions.c.auto,
    sessions.c.eval,
    sessions.c.reward,
    sessions.c.failure,
    sessions.c.num_completions,
    sessions.c.min_version,
    sessions.c.max_version,
    sessions.c.created_at,
    sessions.c.updated_at,
    sessions.c.finished_at,
    sessions.c.claimed_step,
    sessions.c.consumed_step,
    sessions.c.temperature,
)
"""What a list row shows: neither the key hash, nor the reference answer or metadata (the session
page reads those one session at a time)."""


@dataclass(frozen=True)
class SessionFilter:
    """Which sessions a page lists; every field left None matches all."""

    status: str | None = None
    task_id: str | None = None
    group_id: str | None = None
    evaluation: bool | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    version_min: int | None = None  # sessions with a token sampled by a version in [min, max]
    version_max: int | None = None
    since: float | None = None  # created at or after (epoch seconds)
    until: float | None = None  # created before

    def where(self) -> list[Any]:
        c = sessions.c
        clauses: list[Any] = []
        for column, value in ((c.status, self.status), (c.task_id, self.task_id), (c.group_id, self.group_id)):
            if value is not None:
                clauses.append(column == value)
        if self.evaluation is not None:
            clauses.append(c.eval.is_(self.evaluation))
        if self.reward_min is not None:
            clauses.append(c.reward >= self.reward_min)
        if self.reward_max is not None:
            clauses.append(c.reward <= self.reward_max)
        # The session's versions span [min_version, max_version]: it overlaps the range asked for.
        if self.version_min is not None:
            clauses.append(c.max_version >= self.version_min)
        if self.version_max is not None:
            clauses.append(c.min_version <= self.version_max)
        if self.since is not None:
            clauses.append(c.created_at >= self.since)
        if self.until is not None:
            clauses.append(c.created_at < self.until)
        return clauses


@dataclass(frozen=True)
class Cursor:
    """A position in the newest-first order: the row at `(created_at, id)`."""

    created_at: float
    id: str


@dataclass
class Page:
    rows: list[Row]
    older: Cursor | None  # the last row, when older rows follow it
    newer: Cursor | None  # the first row, when newer rows precede it


def sessions_page(
    conn: Connection,
    where: SessionFilter,
    limit: int,
    *,
    older_than: Cursor | None = None,
    newer_than: Cursor | None = None,
) -> Page:
    """`limit` sessions matching `where`, newest first: the newest ones, those just older than
    `older_than`, or those just newer than `newer_than` (paging back towards the newest)."""
    key = tuple_(sessions.c.created_at, sessions.c.id)
    query = select(*SUMMARY_COLUMNS).where(*where.where()).limit(limit + 1)
    if newer_than is not None:
        query = query.where(key > tuple_(newer_than.created_at, newer_than.id))
        rows = conn.execute(query.order_by(sessions.c.created_at.asc(), sessions.c.id.asc())).all()
        more_newer = len(rows) > limit
        rows = rows[:limit][::-1]
        return Page(rows, older=_cursor(rows[-1]) if rows else None, newer=_cursor(rows[0]) if more_newer else None)
    if older_than is not None:
        query = query.where(key < tuple_(older_than.created_at, older_than.id))
    rows = conn.execute(query.order_by(sessions.c.created_at.desc(), sessions.c.id.desc())).all()
    more_older = len(rows) > limit
    rows = rows[:limit]
    older = _cursor(rows[-1]) if more_older else None
    return Page(rows, older=older, newer=_cursor(rows[0]) if older_than is not None and rows else None)


def _cursor(row: Row) -> Cursor:
    return Cursor(row.created_at, row.id)


def count_sessions_capped(conn: Connection, where: SessionFilter, cap: int) -> int:
    """How many sessions match, counting no further than `cap + 1`: more than `cap` reads as "cap+"."""
    matching = select(sessions.c.id).where(*where.where()).limit(cap + 1).subquery()
    return int(conn.execute(select(func.count()).select_from(matching)).scalar() or 0)


def status_counts(conn: Connection) -> dict[str, int]:
    """Sessions per status, evaluation and automatic ones included (the status index answers it)."""
    rows = conn.execute(select(sessions.c.status, func.count()).group_by(sessions.c.status)).all()
    return {status: int(count) for status, count in rows}


def session_row(conn: Connection, session_id: str) -> Row | None:
    """One session with what its own page shows (reference, reward function and metadata included,
    for the admin who reads it), never the key hash."""
    columns = (*SUMMARY_COLUMNS, sessions.c.reference, sessions.c.reward_fn, sessions.c["metadata"], sessions.c.seed)
    return conn.execute(select(*columns).where(sessions.c.id == session_id)).first()


def group_rows(conn: Connection, group_id: str, limit: int) -> list[Row]:
    """The sessions of a group in creation order (the first `limit`), with their reference answers."""
    query = (
        select(*SUMMARY_COLUMNS, sessions.c.reference)
        .where(sessions.c.group_id == group_id)
        .order_by(sessions.c.created_at, sessions.c.id)
        .limit(limit)
    )
    return list(conn.execute(query).all())


def step_batch_rows(conn: Connection, step: int) -> list[Row]:
    """The training sessions a trainer step claimed: the batch a batch-wide estimator normalised over."""
    query = select(*SUMMARY_COLUMNS).where(
        sessions.c.claimed_step == step, sessions.c.eval.is_(False), sessions.c.auto.is_(False)
    )
    return list(conn.execute(query).all())


def turn_summaries(conn: Connection, session_ids: list[str]) -> list[Row]:
    """The turns of some sessions without their token blobs: for a group's side-by-side view."""
    if not session_ids:
        return []
    c = completions.c
    query = (
        select(c.id, c.session_id, c.parent_id, c.depth, c.response, c.finish_reason, c.reward, c.ret, c.created_at)
        .where(c.session_id.in_(session_ids))
        .order_by(c.created_at, c.id)
    )
    return list(conn.execute(query).all())
