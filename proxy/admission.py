"""Admission control: keep rollouts at most `max_staleness` versions ahead of the trainer.

New sessions are refused (429 + Retry-After) once the sessions not yet consumed
by the trainer — open plus finished — reach `(max_staleness + 1) × batch_size`.
Episodes already running continue; the episode runner backs off and retries.
With `max_staleness = 0` this is synchronous on-policy training: a new batch is
admitted only after the trainer consumed the previous one.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select

from proxy.errors import too_many
from proxy.store.db import Database
from proxy.store.schema import sessions


def unconsumed_count(conn) -> int:  # noqa: ANN001 - a SQLAlchemy connection
    query = (
        select(func.count())
        .select_from(sessions)
        .where(sessions.c.status.in_(("open", "finished")), sessions.c.auto.is_(False))
    )
    return int(conn.execute(query).scalar() or 0)


class Admission:
    def __init__(self, db: Database, max_staleness: int, batch_size: int) -> None:
        self.db = db
        self.limit = (max_staleness + 1) * batch_size
        self._lock = asyncio.Lock()
        self.refused = 0

    async def admit(self, create, count: int = 1):  # noqa: ANN001, ANN201 - create: async () -> result
        """Run `create()` for `count` sessions if there is room, else raise 429. Checks are serialized."""
        async with self._lock:
            ahead = await self.db.aread(unconsumed_count)
            if ahead + count > self.limit and not (ahead == 0 and count > self.limit):
                self.refused += 1
                raise too_many(
                    f"{ahead} sessions are waiting for the trainer (limit {self.limit} = "
                    "(max_staleness + 1) × batch_size); retry after the next training step",
                    retry_after=2,
                )
            return await create()
