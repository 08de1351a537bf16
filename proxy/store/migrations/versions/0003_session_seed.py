"""Sessions carry a sampling seed for the calls that set none (derived per prompt, proxy/seeds.py).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A store stamped from the pre-Alembic step list may have been created with the column already.
    if "seed" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("sessions")}:
        op.add_column("sessions", sa.Column("seed", sa.BigInteger))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("seed")
