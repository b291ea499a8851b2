"""The fixed statements of an item's moves, which recallq.state.items (ItemStore) runs: built
once at import, so SQLAlchemy compiles each once. Only ItemStore imports them."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    String,
    bindparam,
    column,
    exists,
    func,
    select,
    tuple_,
    update,
)

from recallq.core.status import ItemStatus, RunStatus
from recallq.state.item_writes import claims_table, items, json_rows, locked_in_id_order, runs

TAKE_READ = select(
    items.c.key,
    items.c.status,
    items.c.owner,
    items.c.lease_until,
    items.c.started_at,
    items.c.ground_truth,
    items.c.run_id,
    items.c.waiting_since,
    runs.c.status.label("run_status"),
    runs.c.model,
    runs.c.scale,
    runs.c.retry_deadline_s,
    runs.c.project,
    runs.c.precision,
    exists().where(claims_table.c.item_id == items.c.id).label("has_claims"),
).join_from(items, runs, runs.c.id == items.c.run_id)
TAKE_READ_ONE = TAKE_READ.where(items.c.id == bindparam("item_id"))
TAKE_READ_GROUP = TAKE_READ.add_columns(items.c.id).where(
    items.c.id.in_(bindparam("item_ids", expanding=True))
)
STORED_CLAIMS = (
    select(claims_table.c.text)
    .where(claims_table.c.item_id == bindparam("item_id"))
    .order_by(claims_table.c.idx)
)
STORED_CLAIMS_OF = (
    select(claims_table.c.item_id, claims_table.c.text)
    .where(claims_table.c.item_id.in_(bindparam("item_ids", expanding=True)))
    .order_by(claims_table.c.item_id, claims_table.c.idx)
)
#: take's write for a group of items (Postgres): each row {id, owner, old_owner, old_status}
#: is taken under its owner while its status and owner are as read; locks in id order, as
#: every writer of several items (recallq.state.item_writes.update_items_in_id_order).
_TAKING = json_rows(
    "b_rows",
    "taking",
    column("id", BigInteger),
    column("owner", String),
    column("old_owner", String),
    column("old_status", String),
)
TAKE_GROUP = (
    update(items)
    .where(
        items.c.id == _TAKING.c.id,
        items.c.status == _TAKING.c.old_status,
        items.c.owner.is_not_distinct_from(_TAKING.c.old_owner),
        items.c.id.in_(locked_in_id_order("b_ids")),
    )
    .values(
        status=ItemStatus.RUNNING,
        owner=_TAKING.c.owner,
        lease_until=bindparam("b_lease"),
        attempts=items.c.attempts + 1,
        started_at=func.coalesce(
            items.c.started_at, bindparam("b_now", type_=items.c.started_at.type)
        ),
    )
    .returning(items.c.id)
)
HAND_OVER = (
    update(items)
    .where(
        items.c.id == bindparam("b_id"),
        items.c.owner == bindparam("b_owner"),
        items.c.status == ItemStatus.RUNNING,
    )
    .values(owner=bindparam("b_new_owner"), lease_until=bindparam("b_lease"))
    .returning(items.c.contexts)
)
#: hand_over for several passes: b_owned holds their (item id, owner token) pairs
HAND_OVER_GROUP = (
    update(items)
    .where(
        tuple_(items.c.id, items.c.owner).in_(bindparam("b_owned", expanding=True)),
        items.c.status == ItemStatus.RUNNING,
    )
    .values(owner=bindparam("b_new_owner"), lease_until=bindparam("b_lease"))
    .returning(items.c.id, items.c.contexts)
)
RUN_CONTEXT = select(runs.c.context).where(runs.c.id == bindparam("run_id"))
RELEASE_NEXT = (
    update(items)
    .where(
        items.c.id.in_(
            select(items.c.id)
            .where(items.c.run_id == bindparam("b_run"), items.c.status == ItemStatus.PENDING)
            .order_by(items.c.id)
            .limit(bindparam("b_limit"))
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        ),
        exists().where(runs.c.id == bindparam("b_run"), runs.c.status == RunStatus.RUNNING),
    )
    .values(status=ItemStatus.QUEUED, lease_until=bindparam("b_lease"))
    .returning(items.c.id)
)
