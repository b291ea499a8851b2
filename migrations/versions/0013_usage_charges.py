"""usage charges: answered calls' usage written after a database outage, once each

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-03 07:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The usage a worker could not write while the database was down is kept (in Redis, or the
    # worker's memory) and written later under its charge id: a charge written twice is
    # counted once (recallq.state.usage_spool).
    op.create_table(
        "usage_charges",
        sa.Column("charge_id", sa.String(32), primary_key=True),
        sa.Column(
            "item_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.ForeignKey("items.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("llm_calls", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("call_attempts", sa.Integer(), nullable=False),
        sa.Column("failed_calls", sa.Integer(), nullable=False),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_usage_charges_item_id", "usage_charges", ["item_id"])


def downgrade() -> None:
    op.drop_index("ix_usage_charges_item_id", table_name="usage_charges")
    op.drop_table("usage_charges")
