"""The random sample of a run's items drawn for labelling (stored with its seed), and its rows
as the labelling CSV."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from recallq.core.status import ItemStatus
from recallq.labels.store import MAX_SAMPLE, MAX_SEED, SAMPLE_COLUMNS, LabelError, csv_line
from recallq.state.tables import Claim, Item, LabelSample, Run, utcnow


def draw_sample(session: Session, run: Run, size: int, seed: int, who: str | None) -> list[str]:
    """Draw `size` items at random among the run's scored items with claims, and keep the
    draw (a new one replaces it). Returns their ids in the order drawn."""
    if not 1 <= size <= MAX_SAMPLE:
        raise LabelError(f"a sample has 1 to {MAX_SAMPLE} items")
    if not 0 <= seed <= MAX_SEED:
        raise LabelError(f"a sample's seed is 0 to {MAX_SEED}")
    keys = list(
        session.scalars(
            select(Item.key)
            .where(
                Item.run_id == run.id,
                Item.status == ItemStatus.SUCCEEDED,
                Item.claims_total > 0,
            )
            .order_by(Item.idx)
        )
    )
    if not keys:
        # the run's state, not the request: the same draw succeeds once items are scored
        raise LabelError(f"run {run.id} has no scored item with claims to label", 409)
    chosen = random.Random(seed).sample(keys, min(size, len(keys)))
    existing = session.get(LabelSample, run.id)
    if existing is None:
        session.add(LabelSample(run_id=run.id, seed=seed, item_keys=chosen, drawn_by=who))
    else:
        existing.seed, existing.item_keys, existing.drawn_by = seed, chosen, who
        existing.drawn_at = utcnow()
    session.flush()
    return chosen


def sample_of(session: Session, run_id: str) -> LabelSample | None:
    return session.get(LabelSample, run_id)


def sample_rows(session: Session, run: Run, keys: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Every claim of these items as rows to fill in (SAMPLE_COLUMNS), in the sample's
    order; the context is the item's passages, numbered as the judge saw them."""
    order = {key: position for position, key in enumerate(keys)}
    items = sorted(
        session.scalars(select(Item).where(Item.run_id == run.id, Item.key.in_(list(keys)))),
        key=lambda item: order[item.key],
    )
    by_item: dict[int, list[Claim]] = defaultdict(list)
    for claim in session.scalars(
        select(Claim).where(Claim.item_id.in_([i.id for i in items])).order_by(Claim.idx)
    ):
        by_item[claim.item_id].append(claim)
    for item in items:
        passages = item.contexts if item.contexts is not None else (run.context or [])
        context = "\n".join(f"[{i}] {text}" for i, text in enumerate(passages))
        for claim in by_item[item.id]:
            yield {
                "item_id": item.key,
                "claim_index": claim.idx,
                "claim": claim.text,
                "context": context,
                "judge_verdict": claim.verdict or "",
                "judge_reason": claim.reason or "",
                "human_verdict": "",
                "note": "",
            }


def sample_lines(rows: Iterable[dict[str, Any]], header: bool = True) -> Iterator[str]:
    """The sample as CSV lines (cells that a spreadsheet would run as formulas made safe)."""
    from recallq.core.export import spreadsheet_safe

    if header:
        yield csv_line(SAMPLE_COLUMNS)
    for row in rows:
        yield csv_line([spreadsheet_safe(row[c]) for c in SAMPLE_COLUMNS])
