"""Sessions record the trainer step that claimed them, apart from how that step used them.

`consumed_step` says what happened (the step that trained it, -1 dropped as stale, -2 skipped);
`claimed_step` says which step took it, so a trainer that resumes from an earlier checkpoint hands
back everything its lost steps claimed, skipped and down-sampled sessions included. Sessions a
step trained before this revision get their step as `claimed_step`.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("claimed_step", sa.Integer))
    op.create_index("ix_sessions_claimed_step", "sessions", ["claimed_step"])
    op.execute("UPDATE sessions SET claimed_step = consumed_step WHERE consumed_step > 0")


def downgrade() -> None:
    op.drop_index("ix_sessions_claimed_step", "sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("claimed_step")
