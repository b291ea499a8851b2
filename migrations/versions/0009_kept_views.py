"""kept views: what is read of completed runs, computed once

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 20:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A completed run's items no longer change (until a retry re-opens it, which sets a new
    # finished_at, part of each key): its run object's aggregates, group summaries and
    # comparisons are computed once (recallq.state.kept) instead of on every read of 100k items.
    op.create_table(
        "kept_views",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column(
            "run_id", sa.String(36), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "other_run_id",
            sa.String(36),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            nullable=True,
        ),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_kept_views_run_id", "kept_views", ["run_id"])
    op.create_index("ix_kept_views_other_run_id", "kept_views", ["other_run_id"])


def downgrade() -> None:
    op.drop_index("ix_kept_views_other_run_id", table_name="kept_views")
    op.drop_index("ix_kept_views_run_id", table_name="kept_views")
    op.drop_table("kept_views")
