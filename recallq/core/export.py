"""Results as files: JSONL (an item per line, with its claims), CSV (a row per item),
claims CSV (a row per claim) and passages CSV (a row per passage, with its relevance). One
code path for `recallq results`, `recallq run --out`, the API's `/results` and the Python API's
data frames."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Sequence
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
#: A CSV row and a data frame also have a column per metadata field, `metadata.NAME` (the
#: `metadata` column keeps the whole object as JSON), so a spreadsheet filters by them.
METADATA_COLUMN = "metadata."


def metadata_columns(fields: Iterable[str]) -> list[str]:
    return [METADATA_COLUMN + name for name in fields]


def metadata_fields_of(results: Iterable[dict[str, Any]]) -> list[str]:
    """The fields of the results' metadata objects, sorted."""
    found: set[str] = set()
    for result in results:
        metadata = result.get("metadata")
        if isinstance(metadata, dict):
            found.update(str(name) for name in metadata)
    return sorted(found)


def with_metadata_columns(
    results: Iterable[dict[str, Any]], fields: Sequence[str]
) -> Iterator[dict[str, Any]]:
    """Each result with a `metadata.NAME` value per field (None where it has none)."""
    for result in results:
        metadata = result.get("metadata")
        values = metadata if isinstance(metadata, dict) else {}
        yield result | {METADATA_COLUMN + name: values.get(name) for name in fields}


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


def lines(
    results: Iterable[dict[str, Any]],
    format: str,
    header: bool = True,
    metadata_fields: Sequence[str] = (),
) -> Iterator[str]:
    """The text of `results` in `format`, a line (or CSV row) at a time. `header`: whether a
    CSV starts with its header row (not for the second page of a stream, say);
    `metadata_fields`: the run's metadata fields, a CSV column each (every page the same)."""
    if format == "jsonl":
        for result in results:
            yield json.dumps(result, ensure_ascii=False) + "\n"
    elif format == "csv":
        columns = ITEM_COLUMNS + metadata_columns(metadata_fields)
        yield from _csv(with_metadata_columns(results, metadata_fields), columns, header)
    elif format == "claims.csv":
        yield from _csv(claim_rows(results), CLAIM_COLUMNS, header)
    elif format == "passages.csv":
        yield from _csv(passage_rows(results), PASSAGE_COLUMNS, header)
    else:
        raise ValueError(f"unknown format {format!r}; use one of {', '.join(FORMATS)}")


def write(
    results: Iterable[dict[str, Any]],
    format: str,
    out: TextIO,
    metadata_fields: Sequence[str] = (),
) -> int:
    """Write `results` to `out`; returns how many lines (rows, header included, for CSV)."""
    count = 0
    for line in lines(results, format, metadata_fields=metadata_fields):
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
