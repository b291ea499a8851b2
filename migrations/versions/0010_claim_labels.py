"""claim labels: a person's verdict on a claim, and the random samples drawn for labelling

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 21:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Human labels sit beside the judge's verdicts (claims.verdict is never changed by one);
    # one per claim, matched by the item and the claim's index.
    op.create_table(
        "claim_labels",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("item_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("claim_idx", sa.Integer(), nullable=False),
        sa.Column("verdict", sa.String(3), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("labelled_by", sa.String(32), nullable=True),
        sa.Column("labelled_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["item_id"], ["items.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("item_id", "claim_idx", name="uq_claim_labels_item_claim"),
    )
    op.create_index("ix_claim_labels_run", "claim_labels", ["run_id", "item_id"])
    # The sample drawn for labelling (seed and item ids): its labels may correct the mean.
    op.create_table(
        "label_samples",
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("item_keys", sa.JSON(), nullable=False),
        sa.Column("drawn_by", sa.String(32), nullable=True),
        sa.Column("drawn_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id"),
    )


def downgrade() -> None:
    op.drop_table("label_samples")
    op.drop_index("ix_claim_labels_run", table_name="claim_labels")
    op.drop_table("claim_labels")
