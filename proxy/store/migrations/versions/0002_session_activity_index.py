"""Index sessions by status and age: how admission control and the timeout sweeper scan them.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sessions_status_updated", "sessions", ["status", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_sessions_status_updated", "sessions")
