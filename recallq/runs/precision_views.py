"""Context precision in a run view: the aggregate columns (one scan with the run's other
aggregates, recallq.runs.run_views), what a kept view holds of them, and the summary fields
(`mean_context_precision` with its 95% interval, ids scores, the precision histogram and where
the first relevant passage was ranked)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, RowMapping, and_, func

from recallq.core import compare as ab
from recallq.state.tables import Item

#: Buckets of a run's score and precision histograms (each a fifth of the scale; the last
#: includes the top).
HISTOGRAM_BUCKETS = 5
PRECISION_HISTOGRAM = "precision_histogram_"
#: Ranks of the first relevant passage counted apart; beyond the last, "5+".
FIRST_RELEVANT_RANKS = (1, 2, 3, 4)
_FIRST = "first_relevant_"


def precision_columns(ok: ColumnElement[bool]) -> list[ColumnElement[Any]]:
    """Means and counts of the items' context precision and ids scores (`ok`: succeeded)."""
    cp, ip, ir = Item.context_precision, Item.id_precision, Item.id_recall
    return [
        func.avg(cp).filter(ok).label("precision_mean"),
        func.count(cp).filter(ok).label("precision_items"),
        func.avg(cp * cp).filter(ok).label("precision_square"),
        func.avg(ip).filter(ok).label("id_precision_mean"),
        func.count(ip).filter(ok).label("id_precision_items"),
        func.avg(ir).filter(ok).label("id_recall_mean"),
        func.count(ir).filter(ok).label("id_recall_items"),
    ]


def histogram_columns(
    column: Any, scale: Any, ok: ColumnElement[bool], prefix: str
) -> list[ColumnElement[Any]]:
    """Counts of `column` in HISTOGRAM_BUCKETS fifths of the scale, labelled prefix + i."""
    columns: list[ColumnElement[Any]] = []
    for i in range(HISTOGRAM_BUCKETS):
        low = column >= scale * (i / HISTOGRAM_BUCKETS)
        high = column < scale * ((i + 1) / HISTOGRAM_BUCKETS)
        bucket = and_(ok, low, high) if i < HISTOGRAM_BUCKETS - 1 else and_(ok, low)
        columns.append(func.count().filter(bucket).label(f"{prefix}{i}"))
    return columns


def first_relevant_columns(ok: ColumnElement[bool]) -> list[ColumnElement[Any]]:
    """How many items had their first relevant passage at rank 1, 2, 3, 4, 5 or later, and
    none (an item with a precision and no relevant passage)."""
    rank = Item.first_relevant_rank
    columns: list[ColumnElement[Any]] = [
        func.count().filter(ok, rank == k).label(f"{_FIRST}{k}") for k in FIRST_RELEVANT_RANKS
    ]
    columns.append(func.count().filter(ok, rank > FIRST_RELEVANT_RANKS[-1]).label(f"{_FIRST}more"))
    columns.append(
        func.count()
        .filter(ok, Item.context_precision.is_not(None), rank.is_(None))
        .label(f"{_FIRST}none")
    )
    return columns


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class PrecisionAggregates:
    """What a run view derives of context precision from its items (kept with the rest)."""

    mean: float | None = None
    items: int = 0
    mean_square: float | None = None
    id_precision_mean: float | None = None
    id_precision_items: int = 0
    id_recall_mean: float | None = None
    id_recall_items: int = 0
    histogram: list[int] | None = None
    #: items by the rank of their first relevant passage: "1".."4", "5+", "none"
    first_relevant: dict[str, int] | None = None

    @classmethod
    def of_row(cls, row: RowMapping, details: bool) -> PrecisionAggregates:
        first = None
        if details:
            first = {str(k): int(row[f"{_FIRST}{k}"]) for k in FIRST_RELEVANT_RANKS}
            first[f"{FIRST_RELEVANT_RANKS[-1] + 1}+"] = int(row[f"{_FIRST}more"])
            first["none"] = int(row[f"{_FIRST}none"])
        return cls(
            mean=_float(row["precision_mean"]),
            items=int(row["precision_items"]),
            mean_square=_float(row["precision_square"]),
            id_precision_mean=_float(row["id_precision_mean"]),
            id_precision_items=int(row["id_precision_items"]),
            id_recall_mean=_float(row["id_recall_mean"]),
            id_recall_items=int(row["id_recall_items"]),
            histogram=(
                [int(row[f"{PRECISION_HISTOGRAM}{i}"]) for i in range(HISTOGRAM_BUCKETS)]
                if details
                else None
            ),
            first_relevant=first,
        )


NO_PRECISION = PrecisionAggregates()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def precision_summary(p: PrecisionAggregates, scale: float, details: bool) -> dict[str, Any]:
    """The run summary's precision fields: `mean_context_precision` (null when no item has
    one: precision off, or no item with a context and a ground truth), its 95% interval and
    how many items it is over; ids scores when items carry ids; with `details` the precision
    histogram and the first relevant passage's rank."""
    summary: dict[str, Any] = {
        "mean_context_precision": _round(p.mean),
        "context_precision_ci95": ab.mean_interval(p.items, p.mean, p.mean_square, scale),
        "precision_items": p.items,
    }
    if p.id_precision_items or p.id_recall_items:
        summary["mean_id_precision"] = _round(p.id_precision_mean)
        summary["mean_id_recall"] = _round(p.id_recall_mean)
    if details and p.histogram is not None:
        edges = [round(scale * i / HISTOGRAM_BUCKETS, 6) for i in range(HISTOGRAM_BUCKETS + 1)]
        summary["precision_histogram"] = {"edges": edges, "counts": p.histogram}
        summary["first_relevant_rank"] = p.first_relevant
    return summary
