"""Alembic's environment: run the revisions on the connection `migrate` hands over.

From the alembic command line (e.g. `alembic revision --autogenerate` while writing
a new revision) it connects to the ini file's `sqlalchemy.url` instead.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, engine_from_config, pool

from proxy.store.schema import Base


def run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata)
    with context.begin_transaction():
        context.run_migrations()


config = context.config
shared = config.attributes.get("connection")
if shared is not None:
    run(shared)
else:
    section = config.get_section(config.config_ini_section, {})
    engine = engine_from_config(section, "sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as connection:
        run(connection)
