"""Schema migrations with Alembic, run in code each time a `Database` opens.

The revisions in `versions/` (0001 the initial schema, 0002 the session activity
index, 0003 `sessions.seed`) bring any database to the schema of `schema.py`; a
change there comes with the next revision. No alembic.ini is read: the Config is
built here and handed the open connection, so one transaction checks, stamps and
upgrades. On PostgreSQL an advisory lock makes concurrent replicas migrate one at a
time. A store written before Alembic (a `schema_version` table, versions 1..3) is
stamped at the matching revision and upgraded from there; a store migrated by a
newer release is refused rather than guessed at.
"""

from __future__ import annotations

import logging
from pathlib import Path

# Alembic reports every check at INFO, some while it is imported; a store is opened at every
# start of every process, which stays quiet unless something is wrong.
logging.getLogger("alembic").setLevel(logging.WARNING)

from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy import Connection, text  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

log = logging.getLogger(__name__)
_PG_LOCK_ID = 0x41524541  # "AREA"
LEGACY_REVISIONS = ("0001", "0002", "0003")
"""The revision each version of the pre-Alembic `schema_version` table corresponds to."""


def alembic_config(conn: Connection | None = None) -> Config:
    """Alembic's Config for this package; `conn` is the connection `env.py` migrates."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent).replace("%", "%%"))
    cfg.attributes["connection"] = conn
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def migrate(engine: Engine) -> str:
    """Bring the database to the latest schema; return the revision it is at."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
        cfg = alembic_config(conn)
        script = ScriptDirectory.from_config(cfg)
        head = script.get_current_head()
        _adopt_legacy(conn, cfg)
        current = current_revision(conn)
        known = {s.revision for s in script.walk_revisions()}
        if current is not None and current not in known:
            raise RuntimeError(
                f"database schema revision {current} is newer than this areal-proxy ({head}); upgrade areal-proxy"
            )
        if current != head:
            command.upgrade(cfg, "head")
            log.debug("store schema upgraded from revision %s to %s", current, head)
        return head


def _adopt_legacy(conn: Connection, cfg: Config) -> None:
    """A store from before Alembic: record its `schema_version` as the matching revision."""
    if not conn.dialect.has_table(conn, "schema_version"):
        return
    version = conn.execute(text("SELECT MAX(version) FROM schema_version")).scalar() or 0
    if version > len(LEGACY_REVISIONS):
        raise RuntimeError(
            f"database schema version {version} is newer than this areal-proxy "
            f"({len(LEGACY_REVISIONS)}); upgrade areal-proxy"
        )
    if version and current_revision(conn) is None:
        command.stamp(cfg, LEGACY_REVISIONS[version - 1])
    conn.execute(text("DROP TABLE schema_version"))
