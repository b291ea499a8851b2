"""provider incidents: per-run retry deadline; per-item attempts, failed calls, deferrals

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retry_deadline_s", sa.Float(), nullable=True))
    with op.batch_alter_table("items", schema=None) as batch_op:
        for name in ("call_attempts", "failed_calls", "deferrals"):
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("waiting_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        for name in ("waiting_since", "deferrals", "failed_calls", "call_attempts"):
            batch_op.drop_column(name)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("retry_deadline_s")
