"""Index sessions by creation time, alone and under a status: the order the web UI pages them in.

The sessions page lists newest first and pages by keyset, `(created_at, id)` below the last row
shown, so any page of a store of millions of sessions is an index range scan of one page's rows
rather than an OFFSET that reads every row before it. The status variant serves the most common
filter ("the failed ones") the same way; `id` in both breaks ties between the sessions of a group,
which are created in one transaction with one timestamp.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sessions_created", "sessions", ["created_at", "id"])
    op.create_index("ix_sessions_status_created", "sessions", ["status", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_sessions_status_created", "sessions")
    op.drop_index("ix_sessions_created", "sessions")
