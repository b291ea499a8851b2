"""usage by stage: what claim extraction used of each item's usage

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 18:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

COUNTERS = ("extraction_calls", "extraction_prompt_tokens", "extraction_completion_tokens")


def upgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        for name in COUNTERS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(
            sa.Column("extraction_cost_usd", sa.Float(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        for name in ("extraction_cost_usd", *reversed(COUNTERS)):
            batch_op.drop_column(name)
