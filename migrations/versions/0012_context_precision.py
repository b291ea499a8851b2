"""context precision: the run's `precision` mode, each item's precision, passages and ids
scores, and the usage of the context_relevance stage; completed items get `cited` precision
from their stored citations (no judge call)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 07:40:00
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

COUNTERS = ("relevance_calls", "relevance_prompt_tokens", "relevance_completion_tokens")
# read and written a run at a time, this many items a statement
CHUNK = 500
ITEMS = sa.table(
    "items",
    sa.column("id", sa.BigInteger()),
    sa.column("context_precision", sa.Float()),
    sa.column("first_relevant_rank", sa.Integer()),
    sa.column("passages", sa.JSON()),
)


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("precision", sa.String(8), nullable=False, server_default="cited")
        )
    with op.batch_alter_table("items", schema=None) as batch_op:
        for name in COUNTERS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(
            sa.Column("relevance_cost_usd", sa.Float(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("context_precision", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("first_relevant_rank", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("passages", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("id_precision", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("id_recall", sa.Float(), nullable=True))
    backfill(op.get_bind())


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def backfill(conn: sa.Connection) -> None:
    """`cited` precision of every succeeded item with a ground truth and a context, from the
    context_indices its claims judged "yes" cite (recallq.core.precision's rule, written out
    here so the migration keeps meaning what it meant when it was written)."""
    runs = conn.execute(sa.text("SELECT id, scale, context FROM runs")).all()
    for run_id, scale, run_context in runs:
        static = _json(run_context) or []
        ids = conn.execute(
            sa.text(
                "SELECT id, contexts FROM items WHERE run_id = :run AND status = 'succeeded' "
                "AND ground_truth IS NOT NULL ORDER BY id"
            ),
            {"run": run_id},
        ).all()
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            cited: dict[int, list[tuple[int, list[int]]]] = {item_id: [] for item_id, _ in chunk}
            rows = conn.execute(
                sa.text(
                    "SELECT item_id, idx, context_indices FROM claims "
                    "WHERE verdict = 'yes' AND item_id IN :ids"
                ).bindparams(sa.bindparam("ids", expanding=True)),
                {"ids": [item_id for item_id, _ in chunk]},
            ).all()
            for item_id, idx, indices in rows:
                cited[item_id].append((idx, list(_json(indices) or [])))
            updates = []
            for item_id, own in chunk:
                contexts = _json(own)
                n = len(static if contexts is None else contexts)
                if n == 0:
                    continue
                claims: list[list[int]] = [[] for _ in range(n)]
                for idx, indices in sorted(cited[item_id]):
                    for c in indices:
                        if isinstance(c, int) and 0 <= c < n and idx not in claims[c]:
                            claims[c].append(idx)
                passages = [
                    {"index": i, "relevant": bool(claims[i]), "claims": claims[i], "reason": None}
                    for i in range(n)
                ]
                hits, total, first = 0, 0.0, None
                for k, passage in enumerate(passages, start=1):
                    if passage["relevant"]:
                        hits += 1
                        total += hits / k
                        first = first or k
                if hits == 0:
                    score = 0.0
                elif total == hits:
                    score = float(scale)
                else:
                    score = round(total / hits * scale, 4)
                updates.append(
                    {
                        "b_id": item_id,
                        "p": score,
                        "f": first,
                        "ps": passages,
                    }
                )
            if updates:
                conn.execute(
                    sa.update(ITEMS)
                    .where(ITEMS.c.id == sa.bindparam("b_id"))
                    .values(
                        context_precision=sa.bindparam("p"),
                        first_relevant_rank=sa.bindparam("f"),
                        passages=sa.bindparam("ps", type_=sa.JSON()),
                    ),
                    updates,
                )


def downgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        for name in (
            "id_recall",
            "id_precision",
            "passages",
            "first_relevant_rank",
            "context_precision",
            "relevance_cost_usd",
            *reversed(COUNTERS),
        ):
            batch_op.drop_column(name)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("precision")
