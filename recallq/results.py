"""A finished run in memory, for Python users: `recallq.evaluate(...)` returns a Result.

Data frames need pandas (imported only when asked for): `to_pandas()` has one row per item,
`claims_to_pandas()` one row per claim, `passages_to_pandas()` one row per passage, with the
columns of the CSV exports.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from recallq.core import compare as ab
from recallq.core import export
from recallq.core import precision as precision_rules
from recallq.core.groups import GroupedItem, check_field, summarise_groups
from recallq.core.status import PublicItemStatus

#: Columns of Result.to_pandas(): the CSV export's, without the claims (claims_to_pandas).
ITEM_FRAME_COLUMNS = [
    column for column in export.ITEM_COLUMNS if column not in ("claims", "passages")
]
_ITEM_DATA_COLUMNS = ("input", "output", "ground_truth", "context", "metadata")


def _pandas() -> Any:
    try:
        return importlib.import_module("pandas")
    except ImportError:
        raise ImportError(
            'data frames need pandas: pip install pandas (or "recallq[parquet]")'
        ) from None


def items_frame(results: Iterable[dict[str, Any]], item_data: bool = True) -> Any:
    """One row per item: id, index, status, score, claims_total, claims_attributed, attempts,
    reason, error and (with `item_data`) input, output, ground_truth, context, metadata, and a
    `metadata.NAME` column per metadata field (as the CSV export has)."""
    columns = [c for c in ITEM_FRAME_COLUMNS if item_data or c not in _ITEM_DATA_COLUMNS]
    results = list(results)
    fields = export.metadata_fields_of(results) if item_data else []
    columns += export.metadata_columns(fields)
    rows = [
        {column: result.get(column) for column in columns}
        for result in export.with_metadata_columns(results, fields)
    ]
    return _pandas().DataFrame(rows, columns=columns)


def claims_frame(results: Iterable[dict[str, Any]]) -> Any:
    """One row per claim: the item's id and index, claim_index, text, verdict,
    context_indices, reason."""
    return _pandas().DataFrame(list(export.claim_rows(results)), columns=export.CLAIM_COLUMNS)


def passages_frame(results: Iterable[dict[str, Any]]) -> Any:
    """One row per passage: the item's id and index, passage_index, relevant, claims (the
    claims that cite it), reason (precision judged)."""
    return _pandas().DataFrame(list(export.passage_rows(results)), columns=export.PASSAGE_COLUMNS)


class Result:
    """A scored run: its view (`run`: status, counts, summary, usage) and every item with its
    claims, input, output, ground truth, context and metadata (`items`)."""

    def __init__(self, run: dict[str, Any], items: list[dict[str, Any]]) -> None:
        self.run = run
        self.items = items

    @property
    def run_id(self) -> str:
        """The run's id in its database: `recallq status`, `compare` and `gate` take it."""
        return str(self.run["id"])

    @property
    def summary(self) -> dict[str, Any]:
        """mean_score, scored_items, claims_total, claims_attributed, no_ground_truth and
        no_context (items scored 0 because they had none) and the score histogram."""
        summary: dict[str, Any] = self.run["summary"]
        return summary

    @property
    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = self.run["counts"]
        return counts

    @property
    def usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = self.run["usage"]
        return usage

    def to_pandas(self, item_data: bool = True) -> Any:
        """A DataFrame with one row per item (see items_frame)."""
        return items_frame(self.items, item_data)

    def claims_to_pandas(self) -> Any:
        """A DataFrame with one row per claim (see claims_frame)."""
        return claims_frame(self.items)

    def passages_to_pandas(self) -> Any:
        """One row per passage, with its relevance (see passages_frame)."""
        return passages_frame(self.items)

    def summary_by(self, field: str) -> dict[str, dict[str, Any]]:
        """The summary per value of metadata field `field`: items, scored_items, failed,
        mean_score."""
        grouped = (
            GroupedItem(
                item["status"],
                item["score"],
                item.get("metadata"),
                context_precision=item.get("context_precision"),
            )
            for item in self.items
        )
        groups = summarise_groups(grouped, field)
        check_field(groups, field, lambda: (n for i in self.items for n in i.get("metadata") or {}))
        return groups

    def compare(self, base: Result, by: str | None = None, top: int = 10) -> dict[str, Any]:
        """This result as the candidate against `base`, items paired by id: the body of
        `GET /v1/compare` (mean difference with a 95% interval, improved/regressed, ...)."""
        scale = self.run["scale"]
        if base.run["scale"] != scale:
            raise ValueError(
                f"the runs have different scales ({base.run['scale']:g} and {scale:g})"
            )
        result = ab.compare(
            _item_scores(base.items), _item_scores(self.items), scale=scale, by=by, top=top
        )
        before = {i["id"]: i.get("context_precision") for i in base.items}
        pairs: list[tuple[str, float, float]] = []
        for item in self.items:
            was, now = before.get(item["id"]), item.get("context_precision")
            if was is not None and now is not None:
                pairs.append((item["id"], was, now))
        result["precision"] = precision_rules.compare(sorted(pairs), top)
        return result

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        mean = self.summary["mean_score"]
        return (
            f"Result(run_id={self.run_id!r}, items={self.counts['total']}, "
            f"succeeded={self.counts['succeeded']}, failed={self.counts['failed']}, "
            f"mean_score={mean!r})"
        )


def _item_scores(items: Iterable[dict[str, Any]]) -> list[ab.ItemScores]:
    return [
        ab.ItemScores(
            item["id"],
            item["score"] if item["status"] == PublicItemStatus.SUCCEEDED else None,
            [(c["text"], c["verdict"]) for c in item["claims"] if c["verdict"] is not None],
            item.get("metadata"),
        )
        for item in items
    ]
