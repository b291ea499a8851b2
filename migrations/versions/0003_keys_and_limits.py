"""keys and limits: API keys of projects; run budgets and cancel reasons; a run's static
context stored once (items that use it keep no copy)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=8), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=True),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_project"), ["project"], unique=False)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("budget_usd", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("budget_tokens", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("cancel_reason", sa.String(length=16), nullable=True))
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.alter_column("contexts", existing_type=sa.JSON(), nullable=True)
    # runs cancelled before this revision were all cancelled by a user
    op.execute("UPDATE runs SET cancel_reason = 'user' WHERE status = 'cancelled'")


def downgrade() -> None:
    # items that use their run's static context get their copy back first
    op.execute(
        "UPDATE items SET contexts = (SELECT runs.context FROM runs WHERE runs.id = items.run_id)"
        " WHERE contexts IS NULL"
    )
    op.execute("UPDATE items SET contexts = '[]' WHERE contexts IS NULL")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.alter_column("contexts", existing_type=sa.JSON(), nullable=False)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("cancel_reason")
        batch_op.drop_column("budget_tokens")
        batch_op.drop_column("budget_usd")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_project"))
    op.drop_table("api_keys")
