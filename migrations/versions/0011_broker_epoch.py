"""broker epoch: Redis's run_id remembered in Postgres, to tell a Redis that lost its data

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 21:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A worker that starts after Redis lost its data cannot tell from Redis alone that
    # anything was lost; this row outlives Redis (recallq.execution.broker_epoch.BrokerEpochs).
    op.create_table(
        "broker_epoch",
        sa.Column("name", sa.String(16), primary_key=True),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("broker_epoch")
