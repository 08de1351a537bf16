"""Sessions can be evaluation episodes: recorded and scored like any other, never trained on.

`areal-proxy eval` and evaluation during training create their sessions with `eval` set; trainers
never claim them and admission control does not count them as waiting for the trainer. A session's
`temperature`, when set, is the sampling temperature of every call it makes, whatever the agent asks
(an evaluation at a chosen temperature, greedy included, of an agent that sets its own).

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
    op.add_column("sessions", sa.Column("temperature", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("eval")
        batch.drop_column("temperature")
