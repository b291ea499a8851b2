"""The files and frames people have, read as raw records with where each came from
("data.csv line 4"): JSONL line by line, a JSON array element by element, CSV row by row,
Parquet batch by batch and a DataFrame slice by slice, so memory stays flat in the size of the
file. Pure but for reading the file the user named; recallq.runs.dataset turns the records
into canonical items. Every error is a DatasetError naming the file and line."""

from __future__ import annotations

import ast
import codecs
import csv
import datetime
import importlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from os import PathLike
from pathlib import Path
from typing import IO, Any

from recallq.core import precision
from recallq.core.inputs import at_column, json_problem

CANONICAL_FIELDS = ("id", "input", "output", "ground_truth", "context")

#: Other names tools give the canonical fields (RAGAS, DeepEval, LangChain, plain Q&A sets).
#: The README quotes this table. ``ground_truths`` (older RAGAS) is a list, joined with "\n".
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "id": (),
    "input": ("user_input", "question", "query"),
    "output": ("response", "actual_output", "answer"),
    "ground_truth": ("reference", "groundTruth", "expected_output", "ground_truths"),
    "context": ("retrieved_contexts", "retrieval_context", "contexts"),
}

METADATA = "metadata"


ALIAS_TO_FIELD = {alias: field for field, aliases in FIELD_ALIASES.items() for alias in aliases}

_CONTEXT_COLUMN = re.compile(r"context_(\d+)")
_JSON_WHITESPACE = " \t\n\r"
_CHUNK_BYTES = 1 << 16
# A JSON value cut off by a chunk boundary fails within this many characters of the buffer's
# end ("-Infinity" and a "\uXXXX\uXXXX" surrogate pair are the longest tokens) or as an
# unterminated string; any other decode error is a real one and is reported without reading on.
_TRUNCATION_MARGIN = 16
# CSV's default 128 KiB cell limit is smaller than a context column of a few long passages.
_CSV_FIELD_LIMIT = 64 * 1024 * 1024
_PARQUET_BATCH_ROWS = 1024
_FRAME_CHUNK_ROWS = 1024


LIST_JOINED_ALIASES = {"ground_truths"}


class DatasetError(ValueError):
    """A dataset the reader cannot use; the message is one line naming the file/line or item."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.splitlines()))


def located_records(
    data: Any, mapping: Mapping[str, str]
) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """Records with where each came from ("data.csv line 4"), or None for in-memory data."""
    if isinstance(data, str | PathLike):
        yield from file_records(Path(data), mapping)
    elif hasattr(data, "to_dict") and hasattr(data, "columns"):
        for record in _frame_records(data):
            yield None, record
    elif isinstance(data, dict | bytes) or not isinstance(data, Iterable):
        raise DatasetError(
            f"data must be a file path, a list of dicts or a pandas DataFrame, got {kind_of(data)}"
        )
    else:
        for index, record in enumerate(data):
            if not isinstance(record, dict):
                raise DatasetError(
                    f"item {index}: must be an object (a dict), got {kind_of(record)}"
                )
            yield None, record


def _frame_records(frame: Any) -> Iterator[dict[str, Any]]:
    # Converting in slices keeps the extra memory to one slice of dicts, not a copy of the frame.
    step = _FRAME_CHUNK_ROWS
    slices = (
        (frame.iloc[start : start + step] for start in range(0, len(frame), step))
        if hasattr(frame, "iloc")
        else [frame]
    )
    for part in slices:
        for row in part.to_dict(orient="records"):
            yield _plain_row(row)


def _is_absent(value: Any) -> bool:
    """None, NaN, and pandas' NA/NaT: what a frame or Parquet file holds for a missing cell."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    return type(value).__name__ in ("NAType", "NaTType")


def _plain(value: Any) -> Any:
    """numpy values and arrays as Python values and lists; timestamps as ISO-8601 strings."""
    if isinstance(value, str | bytes | bool | int | float) or value is None:
        return value
    if isinstance(value, datetime.date | datetime.time):
        return None if _is_absent(value) else value.isoformat()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _plain(value.tolist())
    return value


def _plain_row(row: Mapping[Any, Any]) -> dict[Any, Any]:
    plain = {}
    for name, value in row.items():
        if _is_absent(value):
            continue
        converted = _plain(value)
        if converted is not None:
            plain[name] = converted
    return plain


def file_records(path: Path, mapping: Mapping[str, str]) -> Iterator[tuple[str, dict[str, Any]]]:
    name = str(path)
    if not path.exists():
        raise DatasetError(f"{name}: no such file")
    if path.is_dir():
        raise DatasetError(f"{name}: is a directory, not a dataset file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _parquet_records(path, name)
        return
    if suffix == ".csv":
        yield from _csv_records(path, name, mapping)
        return
    first = _first_byte(path)
    if first is None:
        return
    if first == b"[":
        yield from _json_array_records(path, name)
    elif first == b"{":
        yield from _jsonl_records(path, name, json_suffix=suffix == ".json")
    elif suffix in (".json", ".jsonl", ".ndjson"):
        raise DatasetError(
            f"{name}: expects a JSON array or one JSON object per line "
            "(the file starts with neither '[' nor '{')"
        )
    elif _csv_header_is_known(path, name, mapping):
        yield from _csv_records(path, name, mapping)
    else:
        raise DatasetError(
            f"{name}: expects JSONL, JSON or CSV (a CSV header must name at least one item "
            "field such as ground_truth or context)"
        )


def _not_utf8(name: str, line: int, exc: UnicodeDecodeError) -> DatasetError:
    return DatasetError(f"{name} line {line}: not UTF-8 ({exc.reason}); save the file as UTF-8")


def _first_byte(path: Path) -> bytes | None:
    """The first non-blank byte, skipping a byte-order mark; None for a blank file."""
    with path.open("rb") as file:
        head = b""
        while chunk := file.read(_CHUNK_BYTES):
            head = (head + chunk).removeprefix(codecs.BOM_UTF8).lstrip()
            if head:
                return head[:1]
    return None


def _utf8_lines(file: IO[bytes], name: str) -> Iterator[tuple[int, str]]:
    """Numbered lines decoded one by one, so a bad byte is reported on its own line."""
    for number, raw in enumerate(file, start=1):
        if number == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(name, number, exc) from None


def _jsonl_records(
    path: Path, name: str, *, json_suffix: bool
) -> Iterator[tuple[str, dict[str, Any]]]:
    first_record = True
    with path.open("rb") as file:
        for number, line in _utf8_lines(file, name):
            if not line.strip():
                continue
            where = f"{name} line {number}"
            try:
                # Without its line break, so an error at the end of the line has its column.
                record = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                # A pretty-printed single object is the usual way a .json file gets here.
                hint = (
                    " (a .json file holds a JSON array of items, or one item per line)"
                    if json_suffix and first_record
                    else ""
                )
                raise DatasetError(f"{where}: invalid JSON: {json_problem(exc)}{hint}") from None
            if not isinstance(record, dict):
                raise DatasetError(f"{where}: expected a JSON object, got {kind_of(record)}")
            first_record = False
            yield where, record


class _JsonArrayStream:
    """Elements of a top-level JSON array, decoded one at a time from a growing text window.

    ``json`` has no incremental parser, so each element is decoded with ``raw_decode`` from a
    buffer that holds the unread rest of the current chunk; when an element runs past the
    buffer, the buffer is doubled (not grown by a fixed chunk, which would make decoding a large
    element quadratic). Consumed text is dropped, so memory is one element plus one chunk.
    """

    def __init__(self, file: IO[bytes], name: str) -> None:
        self.file, self.name = file, name
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.json = json.JSONDecoder()
        self.buffer, self.pos, self.eof = "", 0, False
        self.at_start = True
        # Line and column of buffer[0], so positions can be reported in file terms.
        self.base_line, self.base_column = 1, 1

    def location(self, pos: int) -> tuple[int, int]:
        line = self.base_line + self.buffer.count("\n", 0, pos)
        last_newline = self.buffer.rfind("\n", 0, pos)
        column = pos - last_newline if last_newline >= 0 else self.base_column + pos
        return line, column

    def error(self, pos: int, what: str) -> DatasetError:
        line, column = self.location(pos)
        return DatasetError(f"{self.name} line {line}: {at_column(what, column)}")

    def fill(self, at_least: int = _CHUNK_BYTES) -> None:
        """Append at least ``at_least`` more bytes of text to the buffer (or reach the end)."""
        self.drop_consumed()
        raw = self.file.read(max(at_least, _CHUNK_BYTES))
        self.eof = not raw
        try:
            text = self.decoder.decode(raw, final=self.eof)
        except UnicodeDecodeError as exc:
            good = bytes(exc.object[: exc.start]).decode("utf-8", errors="replace")
            line = self.base_line + self.buffer.count("\n") + good.count("\n")
            raise _not_utf8(self.name, line, exc) from None
        if self.at_start:
            text, self.at_start = text.removeprefix("\ufeff"), False
        self.buffer += text

    def drop_consumed(self) -> None:
        if self.pos == 0:
            return
        self.base_line, self.base_column = self.location(self.pos)
        self.buffer, self.pos = self.buffer[self.pos :], 0

    def next_character(self) -> str | None:
        """Skip JSON whitespace and return the next character without consuming it."""
        while True:
            while self.pos < len(self.buffer) and self.buffer[self.pos] in _JSON_WHITESPACE:
                self.pos += 1
            if self.pos < len(self.buffer):
                return self.buffer[self.pos]
            if self.eof:
                return None
            self.fill()

    def value(self) -> tuple[Any, int]:
        """Decode the value at the current position; returns it and the line it starts on."""
        while True:
            try:
                value, end = self.json.raw_decode(self.buffer, self.pos)
            except json.JSONDecodeError as exc:
                truncated = exc.msg.startswith("Unterminated string") or (
                    exc.pos >= len(self.buffer) - _TRUNCATION_MARGIN
                )
                if self.eof or not truncated:
                    raise self.error(exc.pos, f"invalid JSON: {exc.msg}") from None
                self.fill(at_least=len(self.buffer) - self.pos)
                continue
            line = self.location(self.pos)[0]
            self.pos = end
            return value, line

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        if self.next_character() != "[":
            raise self.error(self.pos, "expected a JSON array")
        self.pos += 1
        if self.next_character() == "]":
            self.pos += 1
        else:
            while True:
                if self.next_character() is None:
                    raise self.error(self.pos, "invalid JSON: the array is not closed")
                value, line = self.value()
                where = f"{self.name} line {line}"
                if not isinstance(value, dict):
                    raise DatasetError(f"{where}: expected a JSON object, got {kind_of(value)}")
                yield where, value
                after = self.next_character()
                self.pos += 1
                if after == "]":
                    break
                if after != ",":
                    what = "the array is not closed" if after is None else "expecting ','"
                    raise self.error(self.pos - 1, f"invalid JSON: {what}")
        if self.next_character() is not None:
            raise self.error(self.pos, "invalid JSON: extra data after the array")


def _json_array_records(path: Path, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open("rb") as file:
        yield from _JsonArrayStream(file, name).records()


def _context_columns(mapping: Mapping[str, str]) -> set[str]:
    """Columns that give an item's context whole (as opposed to context_1..context_n)."""
    mapped = {source for source, target in mapping.items() if target == "context"}
    mapped_away = {source for source, target in mapping.items() if target != "context"}
    return {"context", *FIELD_ALIASES["context"], *mapped} - mapped_away


def _id_columns(mapping: Mapping[str, str]) -> set[str]:
    """Columns that hold an item's retrieved or reference passage ids (a list each)."""
    names = {precision.RETRIEVED_IDS, precision.REFERENCE_IDS}
    targets = names | {f"metadata.{name}" for name in names}
    mapped = {source for source, target in mapping.items() if target in targets}
    return (names - set(mapping)) | mapped


def _names_a_field(header: list[str], mapping: Mapping[str, str]) -> bool:
    """Whether a CSV header names at least one item field (or a column mapped to one)."""
    known = {*CANONICAL_FIELDS, *ALIAS_TO_FIELD, *mapping}
    names = {cell.strip() for cell in header}
    return bool(names & known) or any(_CONTEXT_COLUMN.fullmatch(n) for n in names)


def _csv_header_is_known(path: Path, name: str, mapping: Mapping[str, str]) -> bool:
    with path.open("rb") as file:
        lines = (line for _, line in _utf8_lines(file, name))
        try:
            header = next(csv.reader(lines), [])
        except csv.Error:
            return False
    return _names_a_field(header, mapping)


def _csv_list_cell(cell: str, column: str, where: str) -> list[Any] | str:
    """A list cell: a JSON list, or the Python list repr pandas writes for list columns
    (RAGAS's ``to_csv``); any cell not starting with ``[`` is one passage (an ids cell that
    is not a list is refused when its item is checked)."""
    if not cell.lstrip().startswith("["):
        return cell
    what = "ids" if column in _id_columns({}) else "passages"
    try:
        value = json.loads(cell)
    except json.JSONDecodeError as exc:
        try:
            value = ast.literal_eval(cell.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise DatasetError(
                f"{where}: column {column!r} starts with '[' but is not a JSON list "
                f"({json_problem(exc)}); write {what} as a JSON list of strings"
            ) from None
    if not isinstance(value, list):
        raise DatasetError(f"{where}: column {column!r} must be a JSON list of {what}")
    return value


def _csv_metadata_cell(cell: str) -> Any:
    """A ``metadata`` cell holding a JSON object is that object; other text stays text."""
    if cell.lstrip().startswith("{"):
        try:
            value = json.loads(cell)
        except json.JSONDecodeError:
            return cell
        if isinstance(value, dict):
            return value
    return cell


def _csv_records(
    path: Path, name: str, mapping: Mapping[str, str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    context_columns = _context_columns(mapping)
    # Cells of these columns hold lists: passages, older RAGAS's ground_truths, and the ids of
    # the retrieved and the reference passages (id_precision, id_recall).
    list_columns = context_columns | LIST_JOINED_ALIASES | _id_columns(mapping)
    with path.open("rb") as file:
        reader = csv.reader(line for _, line in _utf8_lines(file, name))
        try:
            header = next(reader, None)
            if header is None:
                return
            columns = _csv_columns(header, name, context_columns)
            if not _names_a_field(columns, mapping):
                raise _no_item_field(name, columns)
            # context_1..n become one list under a context name no column of the file uses (a
            # `context` column may be there, mapped away: DeepEval's ideal context)
            free = [c for c in ("context", *FIELD_ALIASES["context"]) if c not in columns]
            numbered_name = free[0] if free else "context"
            last_line = reader.line_num
            for row in reader:
                start_line, last_line = last_line + 1, reader.line_num
                where = f"{name} line {start_line}"
                record = _csv_record(row, columns, where, list_columns, numbered_name)
                if record is not None:
                    yield f"{name} line {start_line}", record
        except csv.Error as exc:
            raise DatasetError(f"{name} line {reader.line_num}: invalid CSV: {exc}") from None


def _no_item_field(name: str, columns: list[str]) -> DatasetError:
    """A CSV file none of whose columns is an item field: each item would be metadata only,
    without a ground truth or a context, which no run can score."""
    named = [c for c in columns if c]
    if not named:
        return DatasetError(f"{name} line 1: the header names no column")
    return DatasetError(
        f"{name} line 1: no column is an item field (the columns are {quoted_list(named)}); "
        "name them id, input, output, ground_truth and context, or map them, e.g. "
        f"--map {named[0]}=ground_truth (mapping= in Python)"
    )


def _csv_columns(header: list[str], name: str, context_columns: set[str]) -> list[str]:
    """Column names, stripped; an unnamed column (pandas' index) is ignored as ''."""
    columns = [cell.strip() for cell in header]
    seen: set[str] = set()
    for column in columns:
        if column and column in seen:
            raise DatasetError(f"{name} line 1: column {column!r} appears twice")
        seen.add(column)
    numbered = [c for c in columns if _CONTEXT_COLUMN.fullmatch(c)]
    whole = [c for c in columns if c in context_columns]
    if numbered and whole:
        raise DatasetError(
            f"{name} line 1: both {whole[0]!r} and {numbered[0]!r} columns give the context; "
            "keep one form"
        )
    return columns


def _csv_record(
    row: list[str],
    columns: list[str],
    where: str,
    list_columns: set[str],
    numbered_name: str = "context",
) -> dict[str, Any] | None:
    """One row as a record; None for a blank row (spreadsheets leave them)."""
    if len(row) > len(columns) and any(cell.strip() for cell in row[len(columns) :]):
        raise DatasetError(f"{where}: {len(row)} cells but the header has {len(columns)} columns")
    record: dict[str, Any] = {}
    numbered: list[tuple[int, str]] = []
    for column, cell in zip(columns, row, strict=False):
        if not column or not cell.strip():
            continue
        if column in list_columns:
            record[column] = _csv_list_cell(cell, column, where)
        elif match := _CONTEXT_COLUMN.fullmatch(column):
            numbered.append((int(match.group(1)), cell))
        elif column == "metadata":
            record[column] = _csv_metadata_cell(cell)
        else:
            record[column] = cell
    if numbered:
        record[numbered_name] = [cell for _, cell in sorted(numbered)]
    return record or None


def _parquet_records(path: Path, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        # Imported by name: pyarrow is an optional extra without type stubs.
        parquet = importlib.import_module("pyarrow.parquet")
    except ImportError:
        raise DatasetError(
            f'{name}: reading Parquet needs pyarrow; pip install "recallq[parquet]"'
        ) from None
    try:
        source = parquet.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError subclasses of its own
        raise DatasetError(f"{name}: not a readable Parquet file ({exc})") from None
    row_number = 0
    for batch in source.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
        for row in batch.to_pylist():
            row_number += 1
            yield f"{name} row {row_number}", _plain_row(row)


def kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return "null" if value is None else f"a {type(value).__name__}"


def quoted_list(names: list[str], conjunction: str = "and") -> str:
    quoted = [repr(name) for name in names]
    if len(quoted) == 1:
        return quoted[0]
    return f"{', '.join(quoted[:-1])} {conjunction} {quoted[-1]}"
