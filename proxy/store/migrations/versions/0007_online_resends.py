"""Completions remember their request's hash and whether a resend replaced them.

Online RL trains on live traffic, where a client that timed out sends the same request again (same
conversation, same parent). `request_hash` is the prefix hash of the request's messages (what the
reply was generated for), indexed with the creation time so the earlier copy is one index range
away; `superseded_by` names the later completion that replaced it. A superseded completion stays
recorded, but it is left out of returns and of training: the client never saw it, the conversation
went on from the resend.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("completions", sa.Column("request_hash", sa.String(64)))
    op.add_column("completions", sa.Column("superseded_by", sa.String(80)))
    op.create_index("ix_completions_request", "completions", ["request_hash", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_completions_request", "completions")
    with op.batch_alter_table("completions") as batch:
        batch.drop_column("superseded_by")
        batch.drop_column("request_hash")
