"""item metadata, and runs listed newest first

Items keep the submitted record's other fields (`metadata`, recallq.runs.dataset), and
`GET /v1/runs` pages a project's runs by creation time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("metadata", sa.JSON(), nullable=True))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_project_created", ["project", "created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_project_created")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_column("metadata")
