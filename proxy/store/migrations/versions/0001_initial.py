"""The initial schema: sessions and completions with their indexes.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("key_hash", sa.String(64), unique=True),
        sa.Column("task_id", sa.String(256)),
        sa.Column("group_id", sa.String(256)),
        sa.Column("metadata", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("auto", sa.Boolean, nullable=False),
        sa.Column("reward_fn", sa.String(256)),
        sa.Column("reference", sa.Text),
        sa.Column("reward", sa.Float),
        sa.Column("failure", sa.Text),
        sa.Column("finish_spec", sa.JSON),
        sa.Column("num_completions", sa.Integer, nullable=False),
        sa.Column("min_version", sa.Integer),
        sa.Column("max_version", sa.Integer),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float),
        sa.Column("consumed_step", sa.Integer),
    )
    for column in ("task_id", "group_id", "status", "updated_at", "consumed_step"):
        op.create_index(f"ix_sessions_{column}", "sessions", [column])
    op.create_table(
        "completions",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("parent_id", sa.String(80)),
        sa.Column("response_id", sa.String(80), nullable=False),
        sa.Column("choice_index", sa.Integer, nullable=False),
        sa.Column("api", sa.String(16), nullable=False),
        sa.Column("depth", sa.Integer, nullable=False),
        sa.Column("chain_hash", sa.String(64), nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("response", sa.JSON, nullable=False),
        sa.Column("prompt_ids", sa.LargeBinary, nullable=False),
        sa.Column("prompt_len", sa.Integer, nullable=False),
        sa.Column("output_ids", sa.LargeBinary, nullable=False),
        sa.Column("output_logprobs", sa.LargeBinary, nullable=False),
        sa.Column("output_versions", sa.LargeBinary, nullable=False),
        sa.Column("finish_reason", sa.String(16), nullable=False),
        sa.Column("temperature", sa.Float, nullable=False),
        sa.Column("reward", sa.Float),
        sa.Column("ret", sa.Float),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    for column in ("session_id", "parent_id", "response_id"):
        op.create_index(f"ix_completions_{column}", "completions", [column])
    op.create_index("ix_completions_chain", "completions", ["chain_hash", "session_id"])


def downgrade() -> None:
    op.drop_table("completions")
    op.drop_table("sessions")
