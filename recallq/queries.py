"""Read models: a run with its counts, summary and usage; items with their claims, paged."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from recallq.db import Database
from recallq.models import Claim, ClaimCache, Item, Run
from recallq.status import ItemStatus, public_item_status, stored_item_statuses


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def run_view(session: Session, run: Run) -> dict[str, Any]:
    # one scan of the run's items for counts, summary and usage (a 100k-item run is read
    # by every status poll)
    statuses = list(ItemStatus)
    row = session.execute(
        select(
            *(func.count().filter(Item.status == status) for status in statuses),
            func.avg(Item.score).filter(Item.status == ItemStatus.SUCCEEDED),
            func.count(Item.score).filter(Item.status == ItemStatus.SUCCEEDED),
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
        ).where(Item.run_id == run.id)
    ).one()
    counts = dict(zip(statuses, row[: len(statuses)], strict=True))
    mean, scored, claims_total, claims_attributed, *spent = row[len(statuses) :]
    calls, prompt, completion, cost, hits, attempts, failed_calls, deferrals = spent
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "model": run.model,
        "scale": run.scale,
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
            "running": counts[ItemStatus.RUNNING],
            "succeeded": counts[ItemStatus.SUCCEEDED],
            "failed": counts[ItemStatus.FAILED],
            "cancelled": counts[ItemStatus.CANCELLED],
        },
        "summary": {
            "mean_score": round(float(mean), 4) if mean is not None else None,
            "scored_items": int(scored),
            "claims_total": int(claims_total),
            "claims_attributed": int(claims_attributed),
        },
        "usage": {
            "llm_calls": int(calls),
            "prompt_tokens": int(prompt),
            "completion_tokens": int(completion),
            "cost_usd": round(float(cost), 6),
            "claim_cache_hits": int(hits),
            "call_attempts": int(attempts),
            "failed_calls": int(failed_calls),
            "deferrals": int(deferrals),
        },
    }


def item_view(item: Item, claims: list[Claim]) -> dict[str, Any]:
    return {
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


def _claims_by_item(session: Session, item_ids: list[int]) -> dict[int, list[Claim]]:
    grouped: dict[int, list[Claim]] = defaultdict(list)
    if item_ids:
        for claim in session.scalars(
            select(Claim).where(Claim.item_id.in_(item_ids)).order_by(Claim.item_id, Claim.idx)
        ):
            grouped[claim.item_id].append(claim)
    return grouped


def items_page(
    session: Session, run_id: str, status: str | None, limit: int, after_index: int | None
) -> tuple[list[dict[str, Any]], int | None]:
    query = select(Item).where(Item.run_id == run_id)
    if status:
        query = query.where(Item.status.in_(stored_item_statuses(status)))
    if after_index is not None:
        query = query.where(Item.idx > after_index)
    items = list(session.scalars(query.order_by(Item.idx).limit(limit + 1)))
    more = len(items) > limit
    items = items[:limit]
    claims = _claims_by_item(session, [i.id for i in items])
    next_index = items[-1].idx if more else None
    return [item_view(i, claims[i.id]) for i in items], next_index


def get_item(session: Session, run_id: str, key: str) -> dict[str, Any] | None:
    item = session.scalars(select(Item).where(Item.run_id == run_id, Item.key == key)).one_or_none()
    if item is None:
        return None
    return item_view(item, _claims_by_item(session, [item.id])[item.id])


def iter_results(session: Session, run_id: str, batch: int = 500) -> Iterator[dict[str, Any]]:
    """Every item with its claims, in index order, read one batch at a time."""
    after: int | None = None
    while True:
        page, after = items_page(session, run_id, None, batch, after)
        yield from page
        if after is None:
            return


CSV_COLUMNS = [
    "id",
    "index",
    "status",
    "score",
    "claims_total",
    "claims_attributed",
    "attempts",
    "reason",
    "error",
    "claims",
]


def jsonl_lines(results: Iterator[dict[str, Any]]) -> Iterator[str]:
    for result in results:
        yield json.dumps(result, ensure_ascii=False) + "\n"


# A spreadsheet runs a cell that starts with one of these as a formula ("CSV injection"):
# such cells get a leading apostrophe, which spreadsheets show as text and do not run.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs as a formula (numbers are left as they are)."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_lines(results: Iterator[dict[str, Any]], header: bool = True) -> Iterator[str]:
    """One row per item; the claims column holds them as JSON. Text cells are made
    spreadsheet-safe (see spreadsheet_safe)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    if header:
        writer.writeheader()
    for result in results:
        row = {**result, "claims": json.dumps(result["claims"], ensure_ascii=False)}
        writer.writerow({key: spreadsheet_safe(row.get(key)) for key in CSV_COLUMNS})
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()


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
