"""Admission control: keep rollouts at most `max_staleness` versions ahead of the trainer.

New sessions are refused (429 + Retry-After) once the sessions not yet in the
engine's weights — open, finished, and claimed by a training step still running —
reach `(max_staleness + 1) × batch_size`. Episodes already running continue; the
episode runner backs off and retries. With `max_staleness = 0` this is synchronous
on-policy training: a new batch is admitted only after the weights trained on the
previous one reached the engine.

The count and the inserts of the new sessions run in one transaction, and on
PostgreSQL that transaction first takes an advisory lock, so the limit holds
across every proxy replica writing the store (SQLite has one proxy process and
serializes its writers).
"""

from __future__ import annotations

from sqlalchemy import Connection

from proxy.errors import APIError, too_many
from proxy.store.db import Database
from proxy.store.sessions import lock_admission, unconsumed_count


class Admission:
    def __init__(self, db: Database, max_staleness: int, batch_size: int) -> None:
        self.db = db
        self.limit = (max_staleness + 1) * batch_size
        self.refused = 0

    def check(self, conn: Connection, count: int) -> APIError | None:
        """Inside the creating transaction: None to admit `count` sessions, else the 429 to answer."""
        lock_admission(conn)
        ahead = unconsumed_count(conn)
        if ahead + count > self.limit and not (ahead == 0 and count > self.limit):
            self.refused += 1
            return too_many(
                f"{ahead} sessions are waiting for the trainer (limit {self.limit} = "
                "(max_staleness + 1) × batch_size); retry after the next training step",
                retry_after=2,
            )
        return None
