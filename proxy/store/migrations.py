"""Schema migrations: an ordered list of steps, each applied once, recorded in `schema_version`.

Step 1 creates the schema. A later change to `schema.py` appends a step that
alters existing databases (ALTER TABLE / data moves) so a store written by an
older release keeps working. On PostgreSQL an advisory lock makes concurrent
replicas migrate one at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection, inspect, select, text
from sqlalchemy.engine import Engine

from proxy.store.schema import Base, SchemaVersion


def _initial(conn: Connection) -> None:
    Base.metadata.create_all(conn)


def _session_activity_index(conn: Connection) -> None:
    # Status + age is how admission control and the timeout sweeper scan sessions.
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_sessions_status_updated ON sessions (status, updated_at)"))


def _session_seed(conn: Connection) -> None:
    # Sessions carry a sampling seed; a database created by step 1 of this release already has it.
    columns = {c["name"] for c in inspect(conn).get_columns("sessions")}
    if "seed" not in columns:
        conn.execute(text("ALTER TABLE sessions ADD COLUMN seed BIGINT"))


MIGRATIONS: list[Callable[[Connection], None]] = [_initial, _session_activity_index, _session_seed]
LATEST = len(MIGRATIONS)
_PG_LOCK_ID = 0x41524541  # "AREA"


def current_version(conn: Connection) -> int:
    if not conn.dialect.has_table(conn, "schema_version"):
        return 0
    return conn.execute(select(SchemaVersion.version).order_by(SchemaVersion.version.desc())).scalar() or 0


def migrate(engine: Engine) -> int:
    """Bring the database to the latest schema; return the version it is at."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
        SchemaVersion.__table__.create(conn, checkfirst=True)
        version = current_version(conn)
        if version > LATEST:
            raise RuntimeError(
                f"database schema version {version} is newer than this areal-proxy ({LATEST}); upgrade areal-proxy"
            )
        for number in range(version + 1, LATEST + 1):
            MIGRATIONS[number - 1](conn)
            conn.execute(SchemaVersion.__table__.insert().values(version=number, applied_at=time.time()))
        return LATEST
