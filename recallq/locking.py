"""Multi-row item updates that cannot deadlock each other."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from recallq.models import Item


def update_items(
    session: Session,
    *conditions: ColumnElement[bool],
    values: dict[str, Any],
    skip_locked: bool = False,
    limit: int | None = None,
) -> list[int]:
    """Lock the matching items in id order, then update them; returns their ids.

    Every writer of several items takes its row locks in the same order, so two of them
    (a cancel and the reaper, say) never wait on each other in a cycle. With skip_locked,
    items another transaction holds right now are left for a later pass.
    """
    locked = (
        select(Item.id)
        .where(*conditions)
        .order_by(Item.id)
        .limit(limit)
        .with_for_update(skip_locked=skip_locked)
    )
    # one statement whatever the count (a list of ids would hit the driver's parameter limit)
    return list(
        session.scalars(
            update(Item)
            .where(Item.id.in_(locked.scalar_subquery()))
            .values(**values)
            .returning(Item.id)
        )
    )
