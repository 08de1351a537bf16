"""Claiming finished sessions for a training step — exactly once, complete groups only.

One transaction picks finished sessions whose group has nothing left open, drops
(and counts) the ones sampled more than `max_staleness` versions before the
trainer's current version, and marks the rest `training` for this step (automatic sessions too, once
something finished them: online RL's live episodes, `proxy/online.py`); once the
step's weights are pushed, `end_step` marks them consumed. Admission control counts
`training` sessions as still ahead of the trainer, so with `max_staleness = 0` no new
episode starts until the engine holds the weights trained on the last batch. On
PostgreSQL the rows are locked with `FOR UPDATE SKIP LOCKED`, so two trainers
(or a restarted one racing its predecessor) never take the same session; SQLite
serializes writers. `claimed_step` records the step that took a session and
`consumed_step` what it did with it (the step that trained it; -1: dropped as
stale; -2: skipped, with the reason in `failure`), so a trainer that resumes
from an earlier checkpoint hands back exactly what its lost steps claimed, skipped
sessions included, and settles what its checkpointed steps left `training`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from sqlalchemy import Connection, Row, func, or_, select, update

from proxy.store.schema import sessions

DROPPED_STALE = -1
SKIPPED_ZERO_VARIANCE = -2


@dataclass
class Claim:
    session_ids: list[str] = field(default_factory=list)
    dropped_stale: list[str] = field(default_factory=list)


def _group_key(row: Row) -> str:
    return row.group_id or row.task_id or row.id


def _scan(conn: Connection, limit: int) -> tuple[list[Row], set[str]]:
    """The `limit` earliest-finished unclaimed sessions (locked on PostgreSQL) and the
    groups among them that cannot be claimed whole yet."""
    query = (
        select(sessions.c.id, sessions.c.group_id, sessions.c.task_id, sessions.c.min_version, sessions.c.finished_at)
        .where(sessions.c.status == "finished", sessions.c.eval.is_(False))
        .order_by(sessions.c.finished_at, sessions.c.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    rows = conn.execute(query).all()
    named = {r.group_id for r in rows if r.group_id}
    incomplete: set[str] = set()
    if named:
        # A group is claimable only when none of its sessions is open and every finished
        # one is among the rows held here: the scan's LIMIT, a row another trainer has
        # locked (SKIP LOCKED) or a session that finished after the scan would otherwise
        # split a group across steps.
        held = {r.id for r in rows}
        members = select(sessions.c.id, sessions.c.group_id, sessions.c.status).where(
            sessions.c.group_id.in_(named),
            sessions.c.status.in_(("open", "finished")),
            sessions.c.eval.is_(False),
        )
        for member in conn.execute(members):
            if member.status == "open" or member.id not in held:
                incomplete.add(member.group_id)
    return rows, incomplete


def claim_batch(
    conn: Connection, *, step: int, batch_size: int, current_version: int, max_staleness: int, scan: int = 0
) -> Claim:
    """Claim complete groups totalling at least `batch_size` sessions, or nothing."""
    floor = current_version - max_staleness
    limit = scan or batch_size * 8
    while True:
        rows, incomplete = _scan(conn, limit)
        groups: OrderedDict[str, list[Row]] = OrderedDict()
        for row in rows:
            groups.setdefault(_group_key(row), []).append(row)
        claim = Claim()
        taken = 0
        for key, members in groups.items():
            if key in incomplete:
                continue
            for row in members:
                if row.min_version is not None and row.min_version < floor:
                    claim.dropped_stale.append(row.id)
                else:
                    claim.session_ids.append(row.id)
                    taken += 1
            if taken >= batch_size:
                break
        if taken >= batch_size or len(rows) < limit:
            break
        limit *= 4  # the window held only part of some groups: look further
    if taken < batch_size:
        # Not enough for a step yet: still drop what is stale, claim nothing else.
        claim.session_ids = []
    if claim.dropped_stale:
        conn.execute(
            update(sessions)
            .where(sessions.c.id.in_(claim.dropped_stale), sessions.c.status == "finished")
            .values(
                status="consumed",
                consumed_step=DROPPED_STALE,
                claimed_step=step,
                failure=f"dropped: sampled before version {floor} (max_staleness {max_staleness})",
            )
        )
    if claim.session_ids:
        conn.execute(
            update(sessions)
            .where(sessions.c.id.in_(claim.session_ids), sessions.c.status == "finished")
            .values(status="training", consumed_step=step, claimed_step=step)
        )
    return claim


def end_step(conn: Connection, step: int) -> None:
    """What step `step` claimed is in the engine's weights now (trained, or skipped): consumed.
    Until then admission control counted it as ahead of the trainer."""
    conn.execute(
        update(sessions)
        .where(sessions.c.status == "training", sessions.c.claimed_step == step)
        .values(status="consumed")
    )


def mark_skipped(conn: Connection, session_ids: list[str], reason: str, *, settle: bool = True) -> None:
    """Claimed sessions a step does not train, with the reason; `settle`: consumed at once, else they
    stay `training` until `end_step`."""
    if session_ids:
        values: dict = {"consumed_step": SKIPPED_ZERO_VARIANCE, "failure": f"skipped: {reason}"}
        if settle:
            values["status"] = "consumed"
        conn.execute(update(sessions).where(sessions.c.id.in_(session_ids)).values(**values))


def release_after(conn: Connection, step: int) -> int:
    """Hand back everything steps after checkpoint `step` claimed (trained, skipped or dropped): the
    updates of those steps were lost."""
    result = conn.execute(
        update(sessions)
        .where(sessions.c.status.in_(("training", "consumed")), sessions.c.claimed_step > step)
        .values(status="finished", consumed_step=None, claimed_step=None, failure=None)
    )
    return result.rowcount or 0


def settle_through(conn: Connection, step: int) -> int:
    """Sessions still `training` from steps up to checkpoint `step` (a trainer that died between its
    checkpoint and `end_step`): their step's update is in the checkpoint, so they are consumed."""
    result = conn.execute(
        update(sessions)
        .where(sessions.c.status == "training", sessions.c.claimed_step <= step)
        .values(status="consumed")
    )
    return result.rowcount or 0


def trained_count(conn: Connection) -> dict[str, int]:
    """Sessions by fate, for progress and for the exactly-once checks."""
    rows = conn.execute(
        select(sessions.c.status, sessions.c.consumed_step, func.count())
        .where(sessions.c.eval.is_(False), or_(sessions.c.auto.is_(False), sessions.c.status != "open"))
        .group_by(sessions.c.status, sessions.c.consumed_step)
    ).all()
    out = {"open": 0, "finished": 0, "training": 0, "trained": 0, "dropped_stale": 0, "skipped": 0, "failed": 0}
    for status, consumed_step, count in rows:
        if status == "consumed":
            key = {DROPPED_STALE: "dropped_stale", SKIPPED_ZERO_VARIANCE: "skipped"}.get(consumed_step, "trained")
            out[key] += count
        elif status in out:
            out[status] += count
    return out
