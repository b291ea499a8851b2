"""provider batch lane: a run's mode; provider batches and their request lines

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("mode", sa.String(length=8), nullable=False, server_default="online")
        )
    op.create_table(
        "provider_batches",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("provider_status", sa.String(length=32), nullable=True),
        sa.Column("provider_batch_id", sa.String(length=200), nullable=True),
        sa.Column("input_file_id", sa.String(length=200), nullable=True),
        sa.Column("output_file_id", sa.String(length=200), nullable=True),
        sa.Column("error_file_id", sa.String(length=200), nullable=True),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("waiting_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("creating_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("provider_batches", schema=None) as batch_op:
        batch_op.create_index("ix_provider_batches_state", ["state"], unique=False)
        batch_op.create_index(batch_op.f("ix_provider_batches_run_id"), ["run_id"], unique=False)
    op.create_table(
        "batch_lines",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("item_id", BigId, nullable=False),
        sa.Column("batch_id", sa.String(length=36), nullable=True),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=12), nullable=False),
        sa.Column("claim_indices", sa.JSON(), nullable=True),
        sa.Column("reask", sa.Boolean(), nullable=False),
        sa.Column("carry", sa.JSON(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["provider_batches.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["item_id"], ["items.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("batch_lines", schema=None) as batch_op:
        batch_op.create_index("ix_batch_lines_batch", ["batch_id"], unique=False)
        batch_op.create_index("ix_batch_lines_run_state", ["run_id", "state"], unique=False)
        batch_op.create_index(batch_op.f("ix_batch_lines_item_id"), ["item_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("batch_lines", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_batch_lines_item_id"))
        batch_op.drop_index("ix_batch_lines_run_state")
        batch_op.drop_index("ix_batch_lines_batch")
    op.drop_table("batch_lines")
    with op.batch_alter_table("provider_batches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_provider_batches_run_id"))
        batch_op.drop_index("ix_provider_batches_state")
    op.drop_table("provider_batches")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("mode")
