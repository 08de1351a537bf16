"""Sessions can be evaluation episodes: recorded and scored like any other, never trained on.

`areal-proxy eval` and evaluation during training create their sessions with `eval` set; trainers
never claim them and admission control does not count them as waiting for the trainer.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("eval", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("eval")
