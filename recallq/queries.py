"""Read models: a run with its counts, summary and usage; runs newest first; items with their
claims, paged; two runs compared; a run sliced by a metadata field."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    RowMapping,
    Select,
    SQLColumnExpression,
    Text,
    and_,
    case,
    cast,
    false,
    func,
    or_,
    select,
    true,
)
from sqlalchemy import text as sql
from sqlalchemy.orm import Session, aliased, defer

from recallq import compare as ab
from recallq import kept
from recallq.batch_store import run_lane_view
from recallq.claim_cache import ClaimCache
from recallq.db import Database
from recallq.groups import GroupedItem, check_field, summarise_groups
from recallq.outcomes import Stage
from recallq.status import ItemStatus, public_item_status, stored_item_statuses
from recallq.tables import Claim, Item, Run
from recallq.usage import NO_USAGE, Usage

#: Buckets of a run's score histogram (each a fifth of the scale; the last includes the top).
HISTOGRAM_BUCKETS = 5
#: Failures grouped by error in a run view: the most frequent errors, up to this many.
FAILURE_GROUPS = 10
_STATUSES = list(ItemStatus)
_ITEM_DATA = ("input", "output", "ground_truth", "contexts", "item_metadata")


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


_COUNT = "count_"
_HISTOGRAM = "histogram_"


def _aggregate_columns(
    scale: Any, details: bool, no_static_context: ColumnElement[bool]
) -> list[ColumnElement[Any]]:
    """Counts, summary, usage and (with `details`) the score histogram of a run: one scan of
    its items (a 100k-item run is read by every status poll), each column labelled with the
    name RunAggregates reads it by. `scale` is the run's scale, and `no_static_context`
    whether the run has no static context, or the runs' columns when several runs are read
    at once."""
    ok = Item.status == ItemStatus.SUCCEEDED
    own_contexts = cast(Item.contexts, Text)
    # an item scored against no passage (recallq.pipeline's no-context rule): its resolved
    # context is empty, its own ([]) or, when it has none (JSON null), the run's static one
    no_context = or_(
        own_contexts == "[]",
        and_(
            or_(Item.contexts.is_(None), own_contexts == "null"),
            no_static_context,
        ),
    )

    def total(column: Any, zero: Any = 0) -> ColumnElement[Any]:
        return func.coalesce(func.sum(column), zero)

    columns: list[ColumnElement[Any]] = [
        *(
            func.count().filter(Item.status == status).label(_COUNT + status)
            for status in _STATUSES
        ),
        func.avg(Item.score).filter(ok).label("mean_score"),
        func.count(Item.score).filter(ok).label("scored"),
        func.avg(Item.score * Item.score).filter(ok).label("mean_square"),
        func.count().filter(ok, Item.ground_truth.is_(None)).label("no_ground_truth"),
        func.count().filter(ok, Item.ground_truth.is_not(None), no_context).label("no_context"),
        total(Item.claims_total).label("claims_total"),
        total(Item.claims_attributed).label("claims_attributed"),
        total(Item.llm_calls).label("llm_calls"),
        total(Item.prompt_tokens).label("prompt_tokens"),
        total(Item.completion_tokens).label("completion_tokens"),
        total(Item.cost_usd, 0.0).label("cost_usd"),
        total(Item.cache_hits).label("claim_cache_hits"),
        total(Item.call_attempts).label("call_attempts"),
        total(Item.failed_calls).label("failed_calls"),
        total(Item.deferrals).label("deferrals"),
        total(Item.extraction_calls).label("extraction_calls"),
        total(Item.extraction_prompt_tokens).label("extraction_prompt_tokens"),
        total(Item.extraction_completion_tokens).label("extraction_completion_tokens"),
        total(Item.extraction_cost_usd, 0.0).label("extraction_cost_usd"),
    ]
    if details:
        for i in range(HISTOGRAM_BUCKETS):
            low = Item.score >= scale * (i / HISTOGRAM_BUCKETS)
            high = Item.score < scale * ((i + 1) / HISTOGRAM_BUCKETS)
            bucket = and_(ok, low, high) if i < HISTOGRAM_BUCKETS - 1 else and_(ok, low)
            columns.append(func.count().filter(bucket).label(f"{_HISTOGRAM}{i}"))
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


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class RunAggregates:
    """What a run view derives from the run's items, read from the aggregate row by column
    name, and with details the histogram and the failures by error. A completed run's is kept
    (recallq.kept) as `body()`, under RUN_VIEW_SHAPE."""

    counts: dict[ItemStatus, int]
    mean_score: float | None
    scored: int
    mean_square: float | None
    no_ground_truth: int
    no_context: int
    claims_total: int
    claims_attributed: int
    #: every stage's usage; `extraction` is the extraction stage's part of it
    usage: Usage
    extraction: Usage
    claim_cache_hits: int
    deferrals: int
    histogram: list[int] | None
    failures: list[dict[str, Any]] | None

    @classmethod
    def of_row(
        cls, row: RowMapping | None, failures: list[dict[str, Any]] | None, details: bool
    ) -> RunAggregates:
        """From an aggregate row (None: a run without items, which no store makes, but a view
        must not fail for it)."""
        if row is None:
            return cls(
                {status: 0 for status in _STATUSES}, None, 0, None, 0, 0, 0, 0, NO_USAGE, NO_USAGE,
                0, 0, [0] * HISTOGRAM_BUCKETS if details else None, [] if details else None,
            )  # fmt: skip
        return cls(
            counts={status: int(row[_COUNT + status]) for status in _STATUSES},
            mean_score=_float(row["mean_score"]),
            scored=int(row["scored"]),
            mean_square=_float(row["mean_square"]),
            no_ground_truth=int(row["no_ground_truth"]),
            no_context=int(row["no_context"]),
            claims_total=int(row["claims_total"]),
            claims_attributed=int(row["claims_attributed"]),
            usage=Usage(
                llm_calls=int(row["llm_calls"]),
                prompt_tokens=int(row["prompt_tokens"]),
                completion_tokens=int(row["completion_tokens"]),
                cost_usd=float(row["cost_usd"]),
                call_attempts=int(row["call_attempts"]),
                failed_calls=int(row["failed_calls"]),
            ),
            extraction=Usage(
                llm_calls=int(row["extraction_calls"]),
                prompt_tokens=int(row["extraction_prompt_tokens"]),
                completion_tokens=int(row["extraction_completion_tokens"]),
                cost_usd=float(row["extraction_cost_usd"]),
            ),
            claim_cache_hits=int(row["claim_cache_hits"]),
            deferrals=int(row["deferrals"]),
            histogram=(
                [int(row[f"{_HISTOGRAM}{i}"]) for i in range(HISTOGRAM_BUCKETS)]
                if details
                else None
            ),
            failures=failures,
        )

    def body(self) -> dict[str, Any]:
        """As kept: JSON, by name."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return fields | {
            "counts": {str(status): n for status, n in self.counts.items()},
            "usage": dataclasses.asdict(self.usage),
            "extraction": dataclasses.asdict(self.extraction),
        }

    @classmethod
    def of_body(cls, body: Any) -> RunAggregates:
        """Read back from `body()`. Raises kept.Misshapen for a body of another shape."""
        try:
            names = {f.name for f in dataclasses.fields(cls)}
            if not isinstance(body, dict) or set(body) != names:
                raise ValueError(f"fields {sorted(body) if isinstance(body, dict) else body!r}")
            counts = body["counts"]
            if set(counts) != {str(status) for status in _STATUSES}:
                raise ValueError(f"statuses {sorted(counts)}")
            histogram = body["histogram"]
            if histogram is not None and len(histogram) != HISTOGRAM_BUCKETS:
                raise ValueError(f"{len(histogram)} histogram buckets")
            return cls(
                **(
                    body
                    | {
                        "counts": {ItemStatus(status): int(n) for status, n in counts.items()},
                        "usage": Usage(**body["usage"]),
                        "extraction": Usage(**body["extraction"]),
                    }
                )  # fmt: skip
            )
        except (KeyError, TypeError, ValueError) as problem:
            raise kept.Misshapen(f"not a run view's aggregates: {problem}") from problem


def _no_static_context() -> ColumnElement[bool]:
    """Whether a run (the runs row of the statement) has no static context."""
    return or_(Run.context.is_(None), cast(Run.context, Text).in_(["null", "[]"]))


#: Bumped when a column counts differently (2: no_context counts the items without a context
#: of their own in a run without a static one).
RUN_VIEW_RULES = 2
#: The shape of a kept run view: the aggregate columns' names and the fields that hold them,
#: so adding a column, a field or a status gives kept views a new shape (computed again), and
#: the version of the rules that count them.
RUN_VIEW_SHAPE = kept.shape(
    "run",
    [str(column.key) for column in _aggregate_columns(1.0, True, false())],
    [f.name for f in dataclasses.fields(RunAggregates)],
    [f.name for f in dataclasses.fields(Usage)],
    ["rules", RUN_VIEW_RULES],
)
_RUN_VIEW = kept.Kind("run", RUN_VIEW_SHAPE, RunAggregates.body, RunAggregates.of_body)
#: Kept comparisons and group summaries: their bodies are the answers' JSON, whose shape is
#: the contract's; the number is bumped when a body changes.
_COMPARISON: kept.Kind[dict[str, Any]] = kept.Kind("compare", kept.shape("compare", [1]))
_GROUP_SUMMARY: kept.Kind[dict[str, dict[str, Any]]] = kept.Kind(
    "groups", kept.shape("groups", [1])
)


def _aggregates(session: Session, run: Run, row: RowMapping | None, details: bool) -> RunAggregates:
    failed = 0 if row is None else row[_COUNT + ItemStatus.FAILED]
    failures = (_failures(session, run.id) if failed else []) if details else None
    return RunAggregates.of_row(row, failures, details)


def _view(session: Session, run: Run, aggregates: RunAggregates, details: bool) -> dict[str, Any]:
    a = aggregates
    counts = a.counts
    summary: dict[str, Any] = {
        "mean_score": round(a.mean_score, 4) if a.mean_score is not None else None,
        "mean_ci95": ab.mean_interval(a.scored, a.mean_score, a.mean_square, run.scale),
        "scored_items": a.scored,
        "claims_total": a.claims_total,
        "claims_attributed": a.claims_attributed,
        # scored 0 because there was nothing to check, not because retrieval missed
        "no_ground_truth": a.no_ground_truth,
        # scored 0 because no passage was retrieved: usually the pipeline feeding recallq
        "no_context": a.no_context,
    }
    if details and a.histogram is not None:
        edges = [round(run.scale * i / HISTOGRAM_BUCKETS, 6) for i in range(HISTOGRAM_BUCKETS + 1)]
        summary["histogram"] = {"edges": edges, "counts": a.histogram}
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
            ItemStatus.PENDING: counts[ItemStatus.PENDING] + counts[ItemStatus.QUEUED],
            ItemStatus.RUNNING: counts[ItemStatus.RUNNING] + counts[ItemStatus.BATCHED],
            ItemStatus.SUCCEEDED: counts[ItemStatus.SUCCEEDED],
            ItemStatus.FAILED: counts[ItemStatus.FAILED],
            ItemStatus.CANCELLED: counts[ItemStatus.CANCELLED],
        },
        "summary": summary,
        "usage": a.usage.spent()
        | {
            "claim_cache_hits": a.claim_cache_hits,
            "call_attempts": a.usage.call_attempts,
            "failed_calls": a.usage.failed_calls,
            "deferrals": a.deferrals,
            "by_stage": {
                Stage.EXTRACTION: a.extraction.spent(),
                Stage.ATTRIBUTION: (a.usage - a.extraction).spent(),
            },
        },
    }
    # the provider batch lane: usage by lane and stage (additive), and a batch run's progress
    lane = run_lane_view(session, run, a.usage)
    view["usage"].update(lane["usage"])
    view["batch"] = lane["batch"]
    if a.failures is not None:
        view["failures"] = a.failures
    return view


def run_view(session: Session, run: Run, details: bool = True) -> dict[str, Any]:
    """The run object of the contract, plus `summary.no_ground_truth` and, with `details`,
    `summary.histogram` and `failures` (failed items grouped by error). Progress polls of a
    process that prints the details at the end pass details=False: a quarter less work. What
    it derives from a completed run's items is kept (recallq.kept)."""

    def aggregate() -> RunAggregates:
        row = session.execute(
            select(
                *_aggregate_columns(run.scale, details, false() if run.context else true())
            ).where(Item.run_id == run.id)
        ).one()
        return _aggregates(session, run, row._mapping, details)

    aggregates = kept.get_or_compute(session, _RUN_VIEW, [run], aggregate, details=details)
    return _view(session, run, aggregates, details)


def run_views(session: Session, runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The views of several runs: those kept read back, the others' items read in one grouped
    scan (and kept, for completed runs)."""
    if not runs:
        return []
    keys = {run.id: kept.key(_RUN_VIEW, [run], details=True) for run in runs}
    found = kept.read(session, _RUN_VIEW, [key for key in keys.values() if key is not None])
    aggregates = {run.id: found[key] for run in runs if (key := keys[run.id]) in found}
    computing = [run for run in runs if run.id not in aggregates]
    if computing:
        rows = session.execute(
            select(
                Item.run_id.label("run_id"),
                *_aggregate_columns(Run.scale, True, _no_static_context()),
            )
            .join(Run, Run.id == Item.run_id)
            .where(Item.run_id.in_([run.id for run in computing]))
            .group_by(Item.run_id)
        ).all()
        scanned = {row.run_id: row._mapping for row in rows}
        keeping: list[kept.View] = []
        for run in computing:
            body = kept.as_json(_aggregates(session, run, scanned.get(run.id), True).body())
            aggregates[run.id] = RunAggregates.of_body(body)
            if (key := keys[run.id]) is not None:
                keeping.append(kept.View(key, run.id, None, body))
        kept.keep(session, _RUN_VIEW, keeping)
    return [_view(session, run, aggregates[run.id], True) for run in runs]


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


#: A runs cursor: the last run's created_at in microseconds since the epoch, `u` (UTC) or `n`
#: (a naive time, SQLite), and its id. Every string of this pattern is one the database can
#: compare, so the served spec can say exactly which cursors are valid.
RUN_CURSOR_PATTERN = r"^[0-9]{1,16}[un]\.[A-Za-z0-9-]{1,64}$"
_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def encode_run_cursor(cursor: RunCursor | None) -> str | None:
    if cursor is None:
        return None
    created, run_id = cursor
    aware = created.tzinfo is not None
    micros = (created - (_EPOCH.replace(tzinfo=UTC) if aware else _EPOCH)) // _MICROSECOND
    return f"{micros}{'u' if aware else 'n'}.{run_id}"


def decode_run_cursor(cursor: str) -> RunCursor:
    """Raises ValueError for a cursor this module did not make."""
    if re.fullmatch(RUN_CURSOR_PATTERN, cursor) is None:
        raise ValueError("not a runs cursor")
    time, run_id = cursor.split(".", 1)
    epoch = _EPOCH.replace(tzinfo=UTC) if time[-1] == "u" else _EPOCH
    return epoch + int(time[:-1]) * _MICROSECOND, run_id


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
        }
        for key, idx, status, score, claims_total, claims_attributed, error, truth in rows[:limit]
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


def _run_brief(run: Run) -> dict[str, Any]:
    return {"id": run.id, "name": run.name, "model": run.model, "status": run.status}


def compare_runs(
    session: Session,
    base: Run,
    candidate: Run,
    by: str | None = None,
    top: int = 10,
    pairs: int = 0,
) -> dict[str, Any]:
    """The contract's comparison of `candidate` against `base`, items paired by id, with
    `base_run` and `candidate_run` (id, name, model, status) and, with `pairs`, up to that many
    of the pairs scored in both as `[key, base score, candidate score]` (for a scatter; an even
    sample in key order when there are more). Raises IncomparableRuns for runs of different
    scales.

    The database pairs the items and counts: a 100k-item comparison reads a few hundred rows
    (pairs counted by their two scores, the largest changes, the flipped claims' totals), not
    every item and claim of both runs; a comparison of two completed runs is kept
    (recallq.kept)."""
    if base.scale != candidate.scale:
        raise IncomparableRuns(
            f"the runs have different scales ({base.scale:g} and {candidate.scale:g}); "
            "compare runs scored on one scale"
        )

    def compare() -> dict[str, Any]:
        pairing = _pair_runs(session, base.id, candidate.id, scale=base.scale, top=top, by=by)
        result = ab.summarise(pairing, scale=base.scale, by_group=by is not None)
        if pairs:
            paired = _Paired(session, base.id, candidate.id)
            result["pairs"] = _pair_sample(paired, pairing, pairs)
        return result

    result = kept.get_or_compute(
        session, _COMPARISON, [base, candidate], compare, by=by, top=top, pairs=pairs
    )
    return {**result, "base_run": _run_brief(base), "candidate_run": _run_brief(candidate)}


def _pair_runs(
    session: Session,
    base_id: str,
    candidate_id: str,
    *,
    scale: float,
    top: int = 10,
    by: str | None = None,
) -> ab.Pairing:
    """Two runs' items paired by key in the database: the same as recallq.compare.pair of
    every item with its claims."""
    if top < 0:
        raise ValueError("top must be 0 or more")
    if session.get_bind().dialect.name == "postgresql":
        # compiling these joins to machine code takes longer (about 70 ms) than running them
        session.execute(sql("SET LOCAL jit = off"))
    paired = _Paired(session, base_id, candidate_id)
    b, c = paired.base, paired.candidate
    # one row per (base score, candidate score[, group]) of the scored pairs, and one with no
    # scores counting the pairs not scored in both
    groups: list[ColumnElement[Any]] = []
    metadata: Callable[[str | None], dict[str, Any] | None] = _no_metadata
    if by is not None:
        base_value, metadata = _metadata_field(session, b, by)
        candidate_value, _ = _metadata_field(session, c, by)
        groups = [base_value, candidate_value]
    columns = [case((paired.scored, column)) for column in (b.score, c.score, *groups)]
    counted: dict[tuple[float, float, str | None], int] = defaultdict(int)
    in_both = unscored = 0
    for n, base_score, candidate_score, *raw in session.execute(
        paired.select(func.count(), *columns).group_by(*columns)
    ):
        in_both += n
        if base_score is None:
            unscored += n
            continue
        group = None if by is None else ab.group_name(metadata(raw[0]), metadata(raw[1]), by)
        counted[base_score, candidate_score, group] += n
    scored = in_both - unscored
    base_items, candidate_items = (
        session.scalar(select(func.count()).select_from(Item).where(Item.run_id == run_id)) or 0
        for run_id in (base_id, candidate_id)
    )
    keyed = None
    if scored <= ab.BOOTSTRAP_MAX_PAIRS:
        rows = session.execute(paired.select(b.key, b.score, c.score).where(paired.scored))
        keyed = sorted((key, base, candidate) for key, base, candidate in rows)
    return ab.Pairing(
        base_only=base_items - in_both,
        candidate_only=candidate_items - in_both,
        unscored=unscored,
        scores=[ab.ScoredPairs(bs, cs, n, g) for (bs, cs, g), n in counted.items()],
        keyed=keyed,
        largest=_largest_changes(session, paired, ab.tolerance(scale), top),
        claims_flipped=_flip_counts(session, paired),
    )


class _Paired:
    """Items of two runs joined on their key: `base` and `candidate` are the two items."""

    def __init__(self, session: Session, base_id: str, candidate_id: str) -> None:
        self.session = session
        self.base, self.candidate = aliased(Item), aliased(Item)
        b, c = self.base, self.candidate
        self.join = and_(c.run_id == candidate_id, c.key == b.key)
        self.base_id = base_id
        self.scored = and_(
            b.status == ItemStatus.SUCCEEDED,
            c.status == ItemStatus.SUCCEEDED,
            b.score.is_not(None),
            c.score.is_not(None),
        )

    def select(self, *columns: Any) -> Select[Any]:
        return (
            select(*columns)
            .select_from(self.base)
            .join(self.candidate, self.join)
            .where(self.base.run_id == self.base_id)
        )

    def in_key_order(self) -> SQLColumnExpression[str]:
        """The base item's key in code point order (Python's order of strings): Postgres
        sorts by its collation unless told to compare bytes."""
        if self.session.get_bind().dialect.name == "postgresql":
            return self.base.key.collate("C")
        return self.base.key


def _largest_changes(
    session: Session, paired: _Paired, tolerance: float, top: int
) -> list[ab.Change]:
    if top == 0:
        return []
    b, c = paired.base, paired.candidate
    size = func.abs(c.score - b.score)
    rows = session.execute(
        paired.select(b.id, c.id, b.key, b.score, c.score)
        .where(paired.scored, size > tolerance)
        .order_by(size.desc(), paired.in_key_order())
        .limit(top)
    ).all()
    claims = _claims_by_item(session, [item_id for row in rows for item_id in row[:2]])

    def verdicts(item_id: int) -> list[tuple[str, str]]:
        return [(cl.text, cl.verdict) for cl in claims[item_id] if cl.verdict is not None]

    return [
        ab.Change(key, base, candidate, ab.flipped_claims(verdicts(bid), verdicts(cid)))
        for bid, cid, key, base, candidate in rows
    ]


def _flip_counts(session: Session, paired: _Paired) -> dict[str, int]:
    """Claims of the same text in both items of a scored pair whose verdict flipped: the
    database joins the claims on their text and counts, per direction."""
    b, c = paired.base, paired.candidate
    base_claim, candidate_claim = aliased(Claim), aliased(Claim)
    verdicts = ("yes", "no")
    no_to_yes, yes_to_no = session.execute(
        paired.select(
            func.count().filter(base_claim.verdict == "no"),
            func.count().filter(base_claim.verdict == "yes"),
        )
        .join(base_claim, base_claim.item_id == b.id)
        .join(
            candidate_claim,
            and_(candidate_claim.item_id == c.id, candidate_claim.text == base_claim.text),
        )
        # the verdicts' inequality as a filter, not a join condition: with it in the join,
        # Postgres misjudges how few claims it matches and joins every claim of both runs
        # on its text before pairing the items (1 s instead of 0.3 s)
        .where(
            paired.scored,
            base_claim.verdict.in_(verdicts),
            candidate_claim.verdict.in_(verdicts),
            candidate_claim.verdict != base_claim.verdict,
        )
    ).one()
    return {"no_to_yes": no_to_yes, "yes_to_no": yes_to_no}


def _pair_sample(
    paired: _Paired, pairing: ab.Pairing, limit: int
) -> list[tuple[str, float, float]]:
    """Up to `limit` of the scored pairs, an even sample in key order (ab.even_positions)."""
    if pairing.keyed is not None and len(pairing.keyed) <= limit:
        return sorted(pairing.keyed)
    b, c = paired.base, paired.candidate
    numbered = (
        paired.select(
            b.key,
            b.score,
            c.score.label("candidate_score"),
            (func.row_number().over(order_by=paired.in_key_order()) - 1).label("position"),
        )
        .where(paired.scored)
        .subquery()
    )
    total = sum(s.count for s in pairing.scores)
    positions = ab.even_positions(total, limit)
    rows = paired.session.execute(
        select(numbered.c.key, numbered.c.score, numbered.c.candidate_score)
        .where(numbered.c.position.in_(positions))
        .order_by(numbered.c.position)
    )
    return [tuple(row) for row in rows]


def group_summary(session: Session, run_id: str, by: str) -> dict[str, dict[str, Any]]:
    """The run's items by the value of metadata field `by` (recallq.groups). The database
    counts alike items (same field value, status and score: scores are rounded, so a run has
    few distinct ones) and recallq.groups names and sums them, so a 100k-item run moves a few
    hundred rows, not 100k. A completed run's summary is kept (recallq.kept)."""

    def summarise() -> dict[str, dict[str, Any]]:
        value, metadata = _metadata_field(session, Item, by)
        rows = session.execute(
            select(value, Item.status, Item.score, func.count())
            .where(Item.run_id == run_id)
            .group_by(value, Item.status, Item.score)
        )
        alike = (GroupedItem(status, score, metadata(raw), n) for raw, status, score, n in rows)
        return summarise_groups(alike, by)

    run = session.get(Run, run_id)
    if run is None:
        groups = summarise()
    else:
        groups = kept.get_or_compute(session, _GROUP_SUMMARY, [run], summarise, by=by)
    check_field(groups, by, lambda: metadata_fields(session, run_id))
    return groups


def _no_metadata(_raw: str | None) -> dict[str, Any] | None:
    return None


def _metadata_field(
    session: Session, item: Any, by: str
) -> tuple[ColumnElement[Any], Callable[[str | None], dict[str, Any] | None]]:
    """What items (`item`: Item or an alias of it) alike in metadata field `by` share, as a
    column, and the metadata that
    recallq.groups reads back from its value. On Postgres that is the field's JSON text (NULL:
    no such field); SQLite's JSON functions do not tell a missing field from a null one, so
    there it is the whole metadata."""
    if session.get_bind().dialect.name == "postgresql":

        def field(raw: str | None) -> dict[str, Any] | None:
            return None if raw is None else {by: json.loads(raw)}

        return cast(item.item_metadata[by], Text), field

    def whole(raw: str | None) -> dict[str, Any] | None:
        return None if raw is None else json.loads(raw)

    return cast(item.item_metadata, Text), whole


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
    return ClaimCache.read(session, keys)
