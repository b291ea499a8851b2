"""Read models: a run with its counts, summary and usage; runs newest first; items with their
claims, paged; two runs compared; a run sliced by a metadata field."""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    SQLColumnExpression,
    Text,
    and_,
    cast,
    func,
    null,
    or_,
    select,
)
from sqlalchemy.orm import Session, defer

from recallq import compare as ab
from recallq.batch_store import run_lane_view
from recallq.db import Database
from recallq.groups import GroupedItem, summarise_groups
from recallq.models import Claim, ClaimCache, Item, Run
from recallq.status import ItemStatus, public_item_status, stored_item_statuses

#: Buckets of a run's score histogram (each a fifth of the scale; the last includes the top).
HISTOGRAM_BUCKETS = 5
#: Failures grouped by error in a run view: the most frequent errors, up to this many.
FAILURE_GROUPS = 10
_STATUSES = list(ItemStatus)
_ITEM_DATA = ("input", "output", "ground_truth", "contexts", "item_metadata")


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _aggregate_columns(scale: Any, details: bool) -> list[ColumnElement[Any]]:
    """Counts, summary, usage and (with `details`) the score histogram of a run: one scan of
    its items (a 100k-item run is read by every status poll). `scale` is the run's scale, or
    the runs.scale column when several runs are read at once."""
    ok = Item.status == ItemStatus.SUCCEEDED
    columns = [
        *(func.count().filter(Item.status == status) for status in _STATUSES),
        func.avg(Item.score).filter(ok),
        func.count(Item.score).filter(ok),
        func.avg(Item.score * Item.score).filter(ok),
        func.count().filter(ok, Item.ground_truth.is_(None)),
        func.coalesce(func.sum(Item.claims_total), 0),
        func.coalesce(func.sum(Item.claims_attributed), 0),
        func.coalesce(func.sum(Item.llm_calls), 0),
        func.coalesce(func.sum(Item.prompt_tokens), 0),
        func.coalesce(func.sum(Item.completion_tokens), 0),
        func.coalesce(func.sum(Item.cost_usd), 0.0),
        func.coalesce(func.sum(Item.cache_hits), 0),
        func.coalesce(func.sum(Item.call_attempts), 0),
        func.coalesce(func.sum(Item.failed_calls), 0),
        func.coalesce(func.sum(Item.deferrals), 0),
        func.coalesce(func.sum(Item.extraction_calls), 0),
        func.coalesce(func.sum(Item.extraction_prompt_tokens), 0),
        func.coalesce(func.sum(Item.extraction_completion_tokens), 0),
        func.coalesce(func.sum(Item.extraction_cost_usd), 0.0),
    ]
    if details:
        for i in range(HISTOGRAM_BUCKETS):
            low = Item.score >= scale * (i / HISTOGRAM_BUCKETS)
            high = Item.score < scale * ((i + 1) / HISTOGRAM_BUCKETS)
            bucket = and_(ok, low, high) if i < HISTOGRAM_BUCKETS - 1 else and_(ok, low)
            columns.append(func.count().filter(bucket))
    return columns


def _failures(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The run's failed items grouped by error, most frequent first, with one example id."""
    rows = session.execute(
        select(Item.error, func.count(), func.min(Item.key))
        .where(Item.run_id == run_id, Item.status == ItemStatus.FAILED)
        .group_by(Item.error)
        .order_by(func.count().desc(), Item.error)
        .limit(FAILURE_GROUPS)
    ).all()
    return [{"error": error or "", "count": n, "example_id": key} for error, n, key in rows]


@dataclass(frozen=True)
class _StageUsage:
    calls: int
    prompt: int
    completion: int
    cost: float

    def __sub__(self, other: _StageUsage) -> _StageUsage:
        return _StageUsage(
            self.calls - other.calls,
            self.prompt - other.prompt,
            self.completion - other.completion,
            max(0.0, self.cost - other.cost),
        )

    def view(self) -> dict[str, Any]:
        return {
            "llm_calls": self.calls,
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "cost_usd": round(self.cost, 6),
        }


def _usage(calls: Any, prompt: Any, completion: Any, cost: Any) -> _StageUsage:
    return _StageUsage(int(calls), int(prompt), int(completion), float(cost))


def _view(session: Session, run: Run, row: Sequence[Any] | None, details: bool) -> dict[str, Any]:
    if row is None:  # a run without items (none is stored, but a view must not fail)
        empty: tuple[Any, ...] = (0,) * len(_STATUSES) + (None,)
        row = empty + (0, None) + (0,) * (15 + HISTOGRAM_BUCKETS * details)
    counts = dict(zip(_STATUSES, row[: len(_STATUSES)], strict=True))
    totals = row[len(_STATUSES) :]
    mean, scored, mean_square, no_truth, claims_total, claims_attributed = totals[:6]
    calls, prompt, completion, cost, hits, attempts, failed_calls, deferrals = totals[6:14]
    extraction = _usage(*totals[14:18])
    attribution = _usage(calls, prompt, completion, cost) - extraction
    failed = counts[ItemStatus.FAILED]
    summary: dict[str, Any] = {
        "mean_score": round(float(mean), 4) if mean is not None else None,
        "mean_ci95": ab.mean_interval(
            int(scored),
            None if mean is None else float(mean),
            None if mean_square is None else float(mean_square),
            run.scale,
        ),
        "scored_items": int(scored),
        "claims_total": int(claims_total),
        "claims_attributed": int(claims_attributed),
        # scored 0 because there was nothing to check, not because retrieval missed
        "no_ground_truth": int(no_truth),
    }
    if details:
        edges = [round(run.scale * i / HISTOGRAM_BUCKETS, 6) for i in range(HISTOGRAM_BUCKETS + 1)]
        summary["histogram"] = {"edges": edges, "counts": [int(n) for n in totals[18:]]}
    view: dict[str, Any] = {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "model": run.model,
        "scale": run.scale,
        "mode": run.mode,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "retry_deadline_s": run.retry_deadline_s,
        "budget_usd": run.budget_usd,
        "budget_tokens": run.budget_tokens,
        "cancel_reason": run.cancel_reason,
        "counts": {
            "total": run.total_items,
            "pending": counts[ItemStatus.PENDING] + counts[ItemStatus.QUEUED],
            "running": counts[ItemStatus.RUNNING] + counts[ItemStatus.BATCHED],
            "succeeded": counts[ItemStatus.SUCCEEDED],
            "failed": failed,
            "cancelled": counts[ItemStatus.CANCELLED],
        },
        "summary": summary,
        "usage": {
            "llm_calls": int(calls),
            "prompt_tokens": int(prompt),
            "completion_tokens": int(completion),
            "cost_usd": round(float(cost), 6),
            "claim_cache_hits": int(hits),
            "call_attempts": int(attempts),
            "failed_calls": int(failed_calls),
            "deferrals": int(deferrals),
            "by_stage": {"extraction": extraction.view(), "attribution": attribution.view()},
        },
    }
    # the provider batch lane: usage by lane and stage (additive), and a batch run's progress
    lane = run_lane_view(session, run, view["usage"])
    view["usage"].update(lane["usage"])
    view["batch"] = lane["batch"]
    if details:
        view["failures"] = _failures(session, run.id) if failed else []
    return view


def run_view(session: Session, run: Run, details: bool = True) -> dict[str, Any]:
    """The run object of the contract, plus `summary.no_ground_truth` and, with `details`,
    `summary.histogram` and `failures` (failed items grouped by error). Progress polls of a
    process that prints the details at the end pass details=False: a quarter less work."""
    row = session.execute(
        select(*_aggregate_columns(run.scale, details)).where(Item.run_id == run.id)
    ).one()
    return _view(session, run, row, details)


def run_views(session: Session, runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The views of several runs, their items read in one grouped scan."""
    if not runs:
        return []
    rows = session.execute(
        select(Item.run_id, *_aggregate_columns(Run.scale, details=True))
        .join(Run, Run.id == Item.run_id)
        .where(Item.run_id.in_([run.id for run in runs]))
        .group_by(Item.run_id)
    ).all()
    found = {row[0]: row[1:] for row in rows}
    return [_view(session, run, found.get(run.id), details=True) for run in runs]


# --- runs, newest first ----------------------------------------------------------------------

RunCursor = tuple[datetime, str]


def list_runs(
    session: Session,
    project: str,
    *,
    status: str | None = None,
    name: str | None = None,
    limit: int = 20,
    after: RunCursor | None = None,
) -> tuple[list[dict[str, Any]], RunCursor | None]:
    """A page of the project's runs, newest first, and the cursor of the next page (None on
    the last). `name` matches exactly."""
    query = select(Run).where(Run.project == project)
    if status:
        query = query.where(Run.status == status)
    if name is not None:
        query = query.where(Run.name == name)
    if after is not None:
        created, run_id = after
        query = query.where(
            or_(Run.created_at < created, and_(Run.created_at == created, Run.id < run_id))
        )
    runs = list(
        session.scalars(query.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit + 1))
    )
    more = len(runs) > limit
    runs = runs[:limit]
    cursor = (runs[-1].created_at, runs[-1].id) if more else None
    return run_views(session, runs), cursor


def encode_run_cursor(cursor: RunCursor | None) -> str | None:
    if cursor is None:
        return None
    text = json.dumps([cursor[0].isoformat(), cursor[1]])
    return base64.urlsafe_b64encode(text.encode()).decode()


def decode_run_cursor(cursor: str) -> RunCursor:
    """Raises ValueError for a cursor this module did not make."""
    try:
        created, run_id = json.loads(base64.urlsafe_b64decode(cursor.encode() + b"=="))
        return datetime.fromisoformat(created), str(run_id)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError("not a runs cursor") from exc


# --- items -----------------------------------------------------------------------------------


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


def _claims_by_item(session: Session, item_ids: list[int]) -> dict[int, list[Claim]]:
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
    claims = _claims_by_item(session, [i.id for i in items])
    next_index = items[-1].idx if more else None
    static = _static_context(session, run_id, items) if item_data else None
    return [item_view(i, claims[i.id], item_data, static) for i in items], next_index


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
    it may and stopped after the item of this index; the next page (`cursor`) searches on."""

    rows: list[dict[str, Any]]
    cursor: ItemsCursor | None
    searched_to: int | None = None


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
        }
        for key, idx, status, score, claims_total, claims_attributed, error, truth in rows[:limit]
    ]
    if len(rows) > limit:
        last = page[-1]
        return ItemsTable(page, (last["score"] if where.by_score else None, last["index"]))
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
            return ItemsTable(page, (score if where.by_score else None, idx), searched_to=idx)
    return ItemsTable(page, None)


def encode_items_cursor(cursor: ItemsCursor | None) -> str | None:
    if cursor is None:
        return None
    return base64.urlsafe_b64encode(json.dumps(list(cursor)).encode()).decode()


def decode_items_cursor(cursor: str) -> ItemsCursor:
    """Raises ValueError for a cursor this module did not make."""
    try:
        score, idx = json.loads(base64.urlsafe_b64decode(cursor.encode() + b"=="))
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError("not an items cursor") from exc
    valid_score = score is None or (
        isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score)
    )
    if not valid_score or isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
        raise ValueError("not an items cursor")
    return score, idx


def metadata_fields(session: Session, run_id: str, sample: int = 200) -> list[str]:
    """The metadata fields of the run's first `sample` items that carry metadata, sorted
    (what a page offers to slice the run by)."""
    fields: set[str] = set()
    rows = session.scalars(
        select(Item.item_metadata)
        .where(Item.run_id == run_id, Item.item_metadata.is_not(None))
        .order_by(Item.idx)
        .limit(sample)
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
    return item_view(item, _claims_by_item(session, [item.id])[item.id], item_data, static)


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


# --- comparing and slicing -------------------------------------------------------------------


class IncomparableRuns(ValueError):
    """Two runs whose scores cannot be set against each other (different scales)."""


def item_scores(session: Session, run_id: str, with_metadata: bool = True) -> list[ab.ItemScores]:
    """A run's items as the comparison needs them: score when scored, verdict per claim text,
    and (unless `with_metadata` is false: reading it is most of the cost) metadata."""
    verdicts: dict[int, dict[str, str]] = defaultdict(dict)
    for item_id, text, verdict in session.execute(
        select(Claim.item_id, Claim.text, Claim.verdict)
        .join(Item, Item.id == Claim.item_id)
        .where(Item.run_id == run_id, Claim.verdict.is_not(None))
        .order_by(Claim.item_id, Claim.idx)
    ):
        if verdict is not None:
            verdicts[item_id][text] = verdict
    metadata_column = Item.item_metadata if with_metadata else null()
    rows = session.execute(
        select(Item.id, Item.key, Item.status, Item.score, metadata_column).where(
            Item.run_id == run_id
        )
    )
    return [
        ab.ItemScores(
            key,
            score if status == ItemStatus.SUCCEEDED else None,
            verdicts.get(item_id, {}),
            metadata,
        )
        for item_id, key, status, score, metadata in rows
    ]


def _run_brief(run: Run) -> dict[str, Any]:
    return {"id": run.id, "name": run.name, "model": run.model, "status": run.status}


def compare_runs(
    session: Session,
    base: Run,
    candidate: Run,
    by: str | None = None,
    top: int = 10,
    pairs: bool = False,
) -> dict[str, Any]:
    """The contract's comparison of `candidate` against `base`, items paired by id, with
    `base_run` and `candidate_run` (id, name, model, status) and, with `pairs`, every pair
    scored in both as `[key, base score, candidate score]` (for a scatter). Raises
    IncomparableRuns for runs of different scales."""
    if base.scale != candidate.scale:
        raise IncomparableRuns(
            f"the runs have different scales ({base.scale:g} and {candidate.scale:g}); "
            "compare runs scored on one scale"
        )
    base_items = item_scores(session, base.id, with_metadata=by is not None)
    candidate_items = item_scores(session, candidate.id, with_metadata=by is not None)
    result = ab.compare(base_items, candidate_items, scale=base.scale, top=top, by=by)
    if pairs:
        scored = {item.key: item.score for item in candidate_items if item.score is not None}
        result["pairs"] = [
            (item.key, item.score, scored[item.key])
            for item in base_items
            if item.score is not None and item.key in scored
        ]
    return {**result, "base_run": _run_brief(base), "candidate_run": _run_brief(candidate)}


def group_summary(session: Session, run_id: str, by: str) -> dict[str, dict[str, Any]]:
    """The run's items by the value of metadata field `by` (recallq.groups). The database
    counts alike items (same field value, status and score: scores are rounded, so a run has
    few distinct ones) and recallq.groups names and sums them, so a 100k-item run moves a few
    hundred rows, not 100k. On Postgres alike means the field's JSON text (NULL: no such
    field); SQLite's JSON functions do not tell a missing field from a null one, so there the
    whole metadata is compared."""
    if session.get_bind().dialect.name == "postgresql":
        value = cast(Item.item_metadata[by], Text)

        def metadata(raw: str | None) -> dict[str, Any] | None:
            return None if raw is None else {by: json.loads(raw)}
    else:
        value = cast(Item.item_metadata, Text)

        def metadata(raw: str | None) -> dict[str, Any] | None:
            return None if raw is None else json.loads(raw)

    rows = session.execute(
        select(value, Item.status, Item.score, func.count())
        .where(Item.run_id == run_id)
        .group_by(value, Item.status, Item.score)
    )
    alike = (GroupedItem(status, score, metadata(raw), n) for raw, status, score, n in rows)
    return summarise_groups(alike, by)


def run_budget(database: Database, run_id: str) -> tuple[float | None, int | None] | None:
    """A run's budget (usd, tokens), or None when there is no such run."""
    with database.single_statement() as conn:
        row = conn.execute(
            select(Run.budget_usd, Run.budget_tokens).where(Run.id == run_id)
        ).one_or_none()
    return None if row is None else (row.budget_usd, row.budget_tokens)


def run_spent(database: Database, run_id: str) -> tuple[float, int]:
    """What a run's items have recorded as used: (usd, prompt + completion tokens)."""
    with database.single_statement() as conn:
        row = conn.execute(
            select(
                func.coalesce(func.sum(Item.cost_usd), 0.0),
                func.coalesce(func.sum(Item.prompt_tokens + Item.completion_tokens), 0),
            ).where(Item.run_id == run_id)
        ).one()
    return float(row[0]), int(row[1])


def cached_claims(session: Session, keys: list[str]) -> dict[str, list[str]]:
    """The claim cache's claims for those of these keys it holds."""
    if not keys:
        return {}
    rows = session.execute(
        select(ClaimCache.key, ClaimCache.claims).where(ClaimCache.key.in_(keys))
    )
    return {key: list(claims) for key, claims in rows}
