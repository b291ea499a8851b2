"""Reads of a run's items: an item with its claims, pages by index (the API), the items table
with its filters and cursors (the pages), the metadata fields there are, every result in order."""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    SQLColumnExpression,
    Text,
    and_,
    cast,
    false,
    func,
    or_,
    select,
    true,
)
from sqlalchemy.orm import Session, defer

from recallq.core.status import ItemStatus, public_item_status, stored_item_statuses
from recallq.state.tables import Claim, Item, Run

_ITEM_DATA = ("input", "output", "ground_truth", "contexts", "item_metadata")


def item_view(
    item: Item, claims: list[Claim], item_data: bool = True, run_context: list[str] | None = None
) -> dict[str, Any]:
    """An item with its claims and, unless `item_data` is false, what was submitted: `input`,
    `output`, `ground_truth` (as scored), `context` (the passages judged, which the claims'
    `context_indices` point into: the item's own, or the run's static `run_context`, which
    the run stores once for all its items) and `metadata`."""
    view = {
        "id": item.key,
        "index": item.idx,
        "status": public_item_status(item.status),
        "score": item.score,
        "reason": item.reason,
        "error": item.error,
        "attempts": item.attempts,
        "deferrals": item.deferrals,
        "claims_total": item.claims_total,
        "claims_attributed": item.claims_attributed,
        "claims": [
            {
                "index": c.idx,
                "text": c.text,
                "verdict": c.verdict,
                "context_indices": c.context_indices or [],
                "reason": c.reason,
            }
            for c in claims
        ],
        "context_precision": item.context_precision,
        "first_relevant_rank": item.first_relevant_rank,
        "passages": item.passages,
        "id_precision": item.id_precision,
        "id_recall": item.id_recall,
    }
    if item_data:
        view |= {
            "input": item.input,
            "output": item.output,
            "ground_truth": item.ground_truth,
            "context": item.contexts if item.contexts is not None else (run_context or []),
            "metadata": item.item_metadata,
        }
    return view


def claims_by_item(session: Session, item_ids: list[int]) -> dict[int, list[Claim]]:
    grouped: dict[int, list[Claim]] = defaultdict(list)
    if item_ids:
        for claim in session.scalars(
            select(Claim).where(Claim.item_id.in_(item_ids)).order_by(Claim.item_id, Claim.idx)
        ):
            grouped[claim.item_id].append(claim)
    return grouped


def items_page(
    session: Session,
    run_id: str,
    status: str | None,
    limit: int,
    after_index: int | None,
    item_data: bool = True,
) -> tuple[list[dict[str, Any]], int | None]:
    query = select(Item).where(Item.run_id == run_id)
    if not item_data:
        query = query.options(*(defer(getattr(Item, column)) for column in _ITEM_DATA))
    if status:
        query = query.where(Item.status.in_(stored_item_statuses(status)))
    if after_index is not None:
        query = query.where(Item.idx > after_index)
    items = list(session.scalars(query.order_by(Item.idx).limit(limit + 1)))
    more = len(items) > limit
    items = items[:limit]
    claims = claims_by_item(session, [i.id for i in items])
    next_index = items[-1].idx if more else None
    static = _static_context(session, run_id, items) if item_data else None
    return [item_view(i, claims[i.id], item_data, static) for i in items], next_index


def _has_static_context(session: Session, run_id: str) -> bool:
    """Whether the run has a static context (as the run's summary reads it: an empty one is
    none)."""
    return bool(session.scalar(select(Run.context).where(Run.id == run_id)))


def _static_context(session: Session, run_id: str, items: list[Item]) -> list[str] | None:
    """The run's static context, read when one of these items uses it."""
    if all(item.contexts is not None for item in items):
        return None
    context: list[str] | None = session.scalar(select(Run.context).where(Run.id == run_id))
    return context


#: Items of a run on one page of the items table, at most.
MAX_TABLE_PAGE = 200
#: How much of an item's ground truth a table row shows.
TABLE_TEXT = 160
#: Items a text filter looks through for one page of the items table, at most.
TEXT_SCAN = 20_000
ItemsCursor = tuple[float | None, int]  # (score when sorted by score, idx)
MAX_INDEX = 2**31 - 1  # items.idx is an INTEGER


@dataclass(frozen=True)
class ItemFilter:
    """Which items of a run a table shows, and in which order. `text` matches the item id or
    its ground truth (case-insensitive substring); a score range or a sort by score keeps
    only scored items."""

    status: str | None = None
    min_score: float | None = None
    max_score: float | None = None
    text: str | None = None
    sort: str | None = None  # None (submission order), "score" (lowest first) or "-score"

    @property
    def by_score(self) -> bool:
        return self.sort in ("score", "-score")


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _order(
    sort: str | None, score: SQLColumnExpression[Any], idx: SQLColumnExpression[Any]
) -> list[ColumnElement[Any]]:
    if sort == "score":
        return [score.asc(), idx.asc()]
    if sort == "-score":
        return [score.desc(), idx.asc()]
    return [idx.asc()]


@dataclass(frozen=True)
class ItemsTable:
    """A page of the items table. `searched_to`: a text filter looked through as many items as
    it may and stopped after the item of this index; the next page (`cursor`) searches on.
    A text filter also counts: `matched` of the `searched` items it looked through (those
    after the cursor that pass the other filters) match; `searched_all` when they were every
    such item of the run, so `matched` is exact rather than a lower bound."""

    rows: list[dict[str, Any]]
    cursor: ItemsCursor | None
    searched_to: int | None = None
    matched: int | None = None
    searched: int | None = None
    searched_all: bool = False


def no_context_condition(no_static_context: ColumnElement[bool]) -> ColumnElement[bool]:
    """An item judged against no passage (recallq.pipeline's no-context rule): its resolved
    context is empty, its own ([]) or, when it has none (JSON null), the run's static one
    (`no_static_context`: whether the run has none)."""
    own_contexts = cast(Item.contexts, Text)
    return or_(
        own_contexts == "[]",
        and_(or_(Item.contexts.is_(None), own_contexts == "null"), no_static_context),
    )


def items_table(
    session: Session,
    run_id: str,
    where: ItemFilter,
    limit: int,
    after: ItemsCursor | None = None,
    scan: int = TEXT_SCAN,
) -> ItemsTable:
    """A page of a run's items as table rows (id, index, status, score, claims counts, error,
    the start of the ground truth: no claims, no passages). Keyset-paged on (score, idx) or
    idx, so a page of a 100k-item run reads about `limit` rows; a text filter looks through
    `scan` items at most (a text no item has would otherwise read every item of the run)."""
    limit = max(1, min(limit, MAX_TABLE_PAGE))
    conditions: list[ColumnElement[bool]] = [Item.run_id == run_id]
    if where.status:
        conditions.append(Item.status.in_(stored_item_statuses(where.status)))
    if where.by_score or where.min_score is not None or where.max_score is not None:
        conditions.append(Item.score.is_not(None))
    if where.min_score is not None:
        conditions.append(Item.score >= where.min_score)
    if where.max_score is not None:
        conditions.append(Item.score <= where.max_score)
    if after is not None:
        score, idx = after
        if where.sort == "score":
            conditions.append(or_(Item.score > score, and_(Item.score == score, Item.idx > idx)))
        elif where.sort == "-score":
            conditions.append(or_(Item.score < score, and_(Item.score == score, Item.idx > idx)))
        else:
            conditions.append(Item.idx > idx)
    columns = (
        Item.key,
        Item.idx,
        Item.status,
        Item.score,
        Item.claims_total,
        Item.claims_attributed,
        Item.error,
        func.substr(Item.ground_truth, 1, TABLE_TEXT).label("truth"),
        # scored without any context: the table marks it (the summary's `no_context`)
        and_(
            Item.status == ItemStatus.SUCCEEDED,
            Item.ground_truth.is_not(None),
            no_context_condition(false() if _has_static_context(session, run_id) else true()),
        ).label("no_context"),
    )
    query = select(*columns).where(*conditions).order_by(*_order(where.sort, Item.score, Item.idx))
    if where.text:
        # the next `scan` items in the page's order, and of them the first that match
        scanned = query.add_columns(Item.ground_truth).limit(scan).subquery()
        pattern = _like(where.text)
        matches = or_(
            scanned.c.key.ilike(pattern, escape="\\"),
            scanned.c.ground_truth.ilike(pattern, escape="\\"),
        )
        query = (
            select(*(scanned.c[c.name] for c in query.selected_columns))
            .where(matches)
            .order_by(*_order(where.sort, scanned.c.score, scanned.c.idx))
        )
    rows = session.execute(query.limit(limit + 1)).all()
    counted: dict[str, Any] = {}
    if where.text:
        # the count reads the same bounded window the page does: at most `scan` items
        searched, matched = session.execute(
            select(func.count(), func.count().filter(matches)).select_from(scanned)
        ).one()
        counted = {"matched": matched, "searched": searched, "searched_all": searched < scan}
    page = [
        {
            "id": key,
            "index": idx,
            "status": public_item_status(status),
            "score": score,
            "claims_total": claims_total,
            "claims_attributed": claims_attributed,
            "error": error,
            "ground_truth": truth,
            "no_context": bool(no_context),
        }
        for key, idx, status, score, claims_total, claims_attributed, error, truth, no_context in (
            rows[:limit]
        )
    ]
    if len(rows) > limit:
        last = page[-1]
        cursor = (last["score"] if where.by_score else None, last["index"])
        return ItemsTable(page, cursor, **counted)
    if where.text:
        window_end = session.execute(
            select(Item.score, Item.idx)
            .where(*conditions)
            .order_by(*_order(where.sort, Item.score, Item.idx))
            .offset(scan - 1)
            .limit(1)
        ).one_or_none()
        if window_end is not None:
            score, idx = window_end
            cursor = (score if where.by_score else None, idx)
            return ItemsTable(page, cursor, searched_to=idx, **counted)
    return ItemsTable(page, None, **counted)


def encode_items_cursor(cursor: ItemsCursor | None) -> str | None:
    if cursor is None:
        return None
    return base64.urlsafe_b64encode(json.dumps(list(cursor)).encode()).decode()


def decode_items_cursor(cursor: str, by_score: bool = False) -> ItemsCursor:
    """Raises ValueError for a cursor this module did not make: a page sorted by score
    continues after a score (only scored items are on it), and an index is an INTEGER."""
    try:
        score, idx = json.loads(base64.urlsafe_b64decode(cursor.encode() + b"=="))
        if isinstance(score, int | float) and not isinstance(score, bool):
            score = float(score)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError, OverflowError) as exc:
        raise ValueError("not an items cursor") from exc
    valid_score = (score is None and not by_score) or (
        isinstance(score, float) and math.isfinite(score)
    )
    if not valid_score or isinstance(idx, bool) or not isinstance(idx, int):
        raise ValueError("not an items cursor")
    if not 0 <= idx <= MAX_INDEX:
        raise ValueError("not an items cursor")
    return score, idx


def metadata_fields(session: Session, run_id: str, sample: int | None = 200) -> list[str]:
    """The metadata fields of the run's first `sample` items that carry metadata (None: of
    every item: a CSV export's columns), sorted (what a page offers to slice the run by)."""
    fields: set[str] = set()
    query = (
        select(Item.item_metadata)
        .where(Item.run_id == run_id, Item.item_metadata.is_not(None))
        .order_by(Item.idx)
    )
    rows = session.scalars(
        (query if sample is None else query.limit(sample)).execution_options(yield_per=1000)
    )
    for metadata in rows:
        if isinstance(metadata, dict):
            fields.update(str(name) for name in metadata)
    return sorted(fields)


def get_item(
    session: Session, run_id: str, key: str, item_data: bool = True
) -> dict[str, Any] | None:
    item = session.scalars(select(Item).where(Item.run_id == run_id, Item.key == key)).one_or_none()
    if item is None:
        return None
    static = _static_context(session, run_id, [item]) if item_data else None
    return item_view(item, claims_by_item(session, [item.id])[item.id], item_data, static)


def iter_results(
    session: Session, run_id: str, batch: int = 500, item_data: bool = True
) -> Iterator[dict[str, Any]]:
    """Every item with its claims, in index order, read one batch at a time."""
    after: int | None = None
    while True:
        page, after = items_page(session, run_id, None, batch, after, item_data)
        yield from page
        if after is None:
            return
