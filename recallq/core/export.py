"""Results as files: JSONL (an item per line, with its claims), CSV (a row per item),
claims CSV (a row per claim) and passages CSV (a row per passage, with its relevance). One
code path for `recallq results`, `recallq run --out`, the API's `/results` and the Python API's
data frames."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

FORMATS = ("jsonl", "csv", "claims.csv", "passages.csv")

ITEM_COLUMNS = [
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
    "context_precision",
    "first_relevant_rank",
    "id_precision",
    "id_recall",
    "passages",
    # present unless the results were read without item data
    "input",
    "output",
    "ground_truth",
    "context",
    "metadata",
]
CLAIM_COLUMNS = [
    "id",
    "index",
    "claim_index",
    "text",
    "verdict",
    "context_indices",
    "reason",
]
PASSAGE_COLUMNS = ["id", "index", "passage_index", "relevant", "claims", "reason"]
MEDIA_TYPES = {
    "jsonl": "application/x-ndjson",
    "csv": "text/csv",
    "claims.csv": "text/csv",
    "passages.csv": "text/csv",
}


def format_for(path: Path) -> str:
    """The format a file name asks for: `*.claims.csv` claims CSV, `*.passages.csv` passages
    CSV, `*.csv` CSV, else JSONL."""
    name = path.name.lower()
    if name.endswith("claims.csv"):
        return "claims.csv"
    if name.endswith("passages.csv"):
        return "passages.csv"
    return "csv" if name.endswith(".csv") else "jsonl"


def claim_rows(results: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One row per claim, with its item's id and index (CLAIM_COLUMNS)."""
    for result in results:
        for claim in result["claims"]:
            yield {
                "id": result["id"],
                "index": result["index"],
                "claim_index": claim["index"],
                "text": claim["text"],
                "verdict": claim["verdict"],
                "context_indices": claim["context_indices"],
                "reason": claim["reason"],
            }


def passage_rows(results: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One row per passage of the items with a context precision (PASSAGE_COLUMNS)."""
    for result in results:
        for passage in result.get("passages") or ():
            yield {
                "id": result["id"],
                "index": result["index"],
                "passage_index": passage["index"],
                "relevant": passage["relevant"],
                "claims": passage["claims"],
                "reason": passage.get("reason"),
            }


def lines(results: Iterable[dict[str, Any]], format: str, header: bool = True) -> Iterator[str]:
    """The text of `results` in `format`, a line (or CSV row) at a time. `header`: whether a
    CSV starts with its header row (not for the second page of a stream, say)."""
    if format == "jsonl":
        for result in results:
            yield json.dumps(result, ensure_ascii=False) + "\n"
    elif format == "csv":
        yield from _csv(results, ITEM_COLUMNS, header)
    elif format == "claims.csv":
        yield from _csv(claim_rows(results), CLAIM_COLUMNS, header)
    elif format == "passages.csv":
        yield from _csv(passage_rows(results), PASSAGE_COLUMNS, header)
    else:
        raise ValueError(f"unknown format {format!r}; use one of {', '.join(FORMATS)}")


def write(results: Iterable[dict[str, Any]], format: str, out: TextIO) -> int:
    """Write `results` to `out`; returns how many lines (rows, header included, for CSV)."""
    count = 0
    for line in lines(results, format):
        out.write(line)
        count += 1
    return count


# A spreadsheet runs a cell that starts with one of these as a formula ("CSV injection"):
# such cells get a leading apostrophe, which spreadsheets show as text and do not run.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs as a formula (numbers are left as they are)."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def spreadsheet_original(cell: str) -> str:
    """The text spreadsheet_safe made this cell from (a cell it did not change as it is)."""
    if cell.startswith("'") and cell[1:].startswith(FORMULA_STARTS):
        return cell[1:]
    return cell


def _cell(value: Any) -> Any:
    """Numbers as they are; text made spreadsheet-safe; lists, objects and the like as JSON
    (which starts with `[`, `{` or `"`, never a formula)."""
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, str):
        return spreadsheet_safe(value)
    return json.dumps(value, ensure_ascii=False)


def _csv(rows: Iterable[dict[str, Any]], columns: list[str], header: bool) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({key: _cell(value) for key, value in row.items()})
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()
