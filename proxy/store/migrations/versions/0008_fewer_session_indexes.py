"""Index only what is looked up: a new session writes 5 fewer index entries, a root completion 1.

Every call through the proxy writes a row (or a session and a row), and every index on the table is
one more B-tree to update: CPU in the writer, pages in each commit's log (and fsync), on SQLite and
PostgreSQL alike. Of the session table's indexes, three were never read: `status` alone (every query
on it also filters or orders by `updated_at` or `created_at`, which `ix_sessions_status_updated` and
`ix_sessions_status_created` serve), `updated_at` alone (only ever scanned under a status), and
`consumed_step` (selected and grouped, never searched). Four more are looked up by value only
(`=`, `IN`, `<=`, `>`), and the column is empty on most rows: `task_id` and `group_id` (set by
callers that group episodes), `claimed_step` (set while the trainer holds a session), and a
completion's `parent_id` (empty on the first turn of every conversation). They become partial
indexes over the rows that have a value, which every such lookup implies; a row without one is no
longer written into them.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

UNUSED = ("status", "updated_at", "consumed_step")
SPARSE = {"sessions": ("task_id", "group_id", "claimed_step"), "completions": ("parent_id",)}


def _partial(table: str, column: str) -> None:
    where = sa.text(f"{column} IS NOT NULL")
    op.create_index(f"ix_{table}_{column}", table, [column], sqlite_where=where, postgresql_where=where)


def upgrade() -> None:
    for column in UNUSED:
        op.drop_index(f"ix_sessions_{column}", "sessions")
    for table, columns in SPARSE.items():
        for column in columns:
            op.drop_index(f"ix_{table}_{column}", table)
            _partial(table, column)


def downgrade() -> None:
    for table, columns in SPARSE.items():
        for column in columns:
            op.drop_index(f"ix_{table}_{column}", table)
            op.create_index(f"ix_{table}_{column}", table, [column])
    for column in UNUSED:
        op.create_index(f"ix_sessions_{column}", "sessions", [column])
