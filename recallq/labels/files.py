"""A file of labels imported: CSV or JSONL rows of `item_id, claim_index` (or `claim`),
`verdict` and `note`; every row is stored, skipped (its verdict left empty) or reported as a
problem with its line.

A file is a labels file when its first row says so: a CSV header that names a `verdict` (or
`human_verdict`) column (`CSV_HEADER_PATTERN`, which the served OpenAPI document states), or
a first JSONL line that is an object with such a field. Any other file is refused whole (a
LabelError: 422) with the line that shows it. In a labels file nothing is lost silently: a
line that is not UTF-8, not CSV (a quote never closed, a stray quote) or not a JSON object,
a row with fewer cells than the header or more, a row with no verdict field, is a problem of
its line, and reading goes on with the next line.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from recallq.core.inputs import text_problem
from recallq.labels.store import (
    BIND_CHUNK,
    MAX_IMPORT_BYTES,
    MAX_IMPORT_ROWS,
    LabelError,
    check_note,
    check_verdict,
    store_label,
)
from recallq.state.tables import Claim, Item

VERDICT_FIELDS = ("verdict", "human_verdict")  # human_verdict: the sample file's column
#: A CSV header: up to this many columns before the verdict column and after it, names of up
#: to HEADER_NAME_CHARS characters, after up to this many blank lines (bounds that keep the
#: pattern's match cheap on a 10 MB file)
HEADER_COLUMNS, HEADER_NAME_CHARS = 63, 200
_LINE_END = r"(?:\r\n|\r|\n)"
# a cell quoted (a quote doubled inside) or bare (without a quote)
_CELL = rf'(?:"(?:[^"]|""){{0,{HEADER_NAME_CHARS}}}"|[^",\r\n]{{0,{HEADER_NAME_CHARS}}})'
_VERDICT = r'(?:"(?:human_)?verdict"|(?:human_)?verdict)'
#: How a CSV labels file starts: a header, one of its cells `verdict` or `human_verdict`. The
#: server's rule and the served schema's pattern (ECMA-262 and Python alike).
CSV_HEADER_PATTERN = (
    rf"^\ufeff?{_LINE_END}{{0,{HEADER_COLUMNS}}}(?:{_CELL},){{0,{HEADER_COLUMNS}}}{_VERDICT}"
    rf"(?:,{_CELL}){{0,{HEADER_COLUMNS}}}(?:{_LINE_END}|$)"
)
_CSV_HEADER = re.compile(CSV_HEADER_PATTERN)
#: What the first non-blank line of a JSONL labels file holds (the served schema says the same)
FIRST_JSONL_ROW: dict[str, Any] = {
    "type": "object",
    "anyOf": [{"required": [name]} for name in VERDICT_FIELDS],
}
# a byte that is not UTF-8, as decoding with "surrogateescape" keeps it
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


@dataclass(frozen=True)
class Row:
    """One row of a labels file, by the line it starts on (the header is line 1 of a CSV)."""

    line: int
    fields: dict[str, Any]


def file_format(data: bytes) -> str:
    """ "jsonl" when the first non-blank character is `{`, else "csv"."""
    return "jsonl" if data.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{") else "csv"


def parse_file(data: bytes, format: str | None = None) -> tuple[list[Row], list[dict[str, Any]]]:
    """The rows of a CSV or JSONL labels file (by `file_format` unless `format` says), and the
    lines that are not rows (problems). LabelError for a file that is not a labels file."""
    if len(data) > MAX_IMPORT_BYTES:
        raise LabelError(f"a labels file may be at most {MAX_IMPORT_BYTES // 2**20} MB", 413)
    text = data.removeprefix(b"\xef\xbb\xbf").decode("utf-8", "surrogateescape")
    reader = _jsonl_rows if (format or file_format(data)) == "jsonl" else _csv_rows
    rows, problems = reader(text)
    if len(rows) > MAX_IMPORT_ROWS:
        raise LabelError(f"a labels file may have at most {MAX_IMPORT_ROWS} rows", 413)
    return rows, problems


def _lines(text: str) -> list[str]:
    """The lines of a text, each with its end: only \\n, \\r\\n and \\r end one (str.splitlines
    would also split at characters a JSON string or a CSV cell may hold, such as U+2028)."""
    return list(io.StringIO(text, newline=""))


def _jsonl_rows(text: str) -> tuple[list[Row], list[dict[str, Any]]]:
    rows: list[Row] = []
    problems: list[dict[str, Any]] = []
    for number, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        value: Any = None
        problem = _not_utf8(line)
        if problem is None:
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):  # ValueError: an integer of 4,300+ digits
                problem = "not a JSON object"
            else:
                problem = None if isinstance(value, dict) else "not a JSON object"
        if not rows and not problems and (problem or not _names_a_verdict(value)):
            raise LabelError(
                f"line {number}: a JSONL labels file starts with a JSON object that has a "
                "verdict (or human_verdict) field"
            )
        if problem is not None:
            problems.append({"line": number, "problem": problem})
        else:
            rows.append(Row(number, value))
    if not rows and not problems:
        raise LabelError("line 1: a JSONL labels file starts with a JSON object; this one is empty")
    return rows, problems


def _csv_rows(text: str) -> tuple[list[Row], list[dict[str, Any]]]:
    if _CSV_HEADER.match(text) is None:
        raise LabelError(
            "line 1: a CSV labels file starts with a header that names a verdict (or "
            f"human_verdict) column, as a sample file does (with at most {HEADER_COLUMNS} "
            f"columns before it and after it, names of at most {HEADER_NAME_CHARS} characters)"
        )
    header: list[str] = []
    rows: list[Row] = []
    problems: list[dict[str, Any]] = []
    for number, cells in _csv_records(_lines(text)):
        if not header:
            # the pattern matched, so the csv module reads the same header
            header = cells if isinstance(cells, list) else []
            continue
        if isinstance(cells, str):
            problems.append({"line": number, "problem": cells})
            continue
        problem = _not_utf8(*cells) or _cell_count(cells, len(header))
        if problem is not None:
            problems.append({"line": number, "problem": problem})
            continue
        rows.append(Row(number, dict(zip(header, cells, strict=False))))
    return rows, problems


def _csv_records(lines: list[str]) -> Iterator[tuple[int, list[str] | str]]:
    """(line, cells) for each record of a CSV text, blank ones left out, or (line, problem)
    for one the csv module cannot read. After such a one, reading goes on from the line after
    its first: a quote opened by mistake swallows the lines below it into one cell, and those
    lines are rows of their own."""
    csv.field_size_limit(max(csv.field_size_limit(), MAX_IMPORT_BYTES))  # a file's cell fits
    position = 0
    while position < len(lines):
        read = position  # lines handed to the reader

        def feed() -> Iterator[str]:
            nonlocal read
            while read < len(lines):
                read += 1
                yield lines[read - 1]

        reader = csv.reader(feed(), strict=True)
        while True:
            first = read  # the reader takes a record's lines only as it reads them
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                never_closed = read == len(lines) and "unexpected end of data" in str(exc)
                why = "a quote opened on this line is never closed" if never_closed else exc
                yield first + 1, f"not CSV: {why}"
                position = first + 1
                break
            if any(cell.strip() for cell in cells):
                yield first + 1, cells


def _cell_count(cells: list[str], columns: int) -> str | None:
    if len(cells) > columns and any(cell.strip() for cell in cells[columns:]):
        return f"{len(cells)} cells, more than the header's {columns} columns"
    if len(cells) < columns:
        return f"{len(cells)} cells, fewer than the header's {columns} columns"
    return None


def _not_utf8(*texts: str) -> str | None:
    for text in texts:
        found = _NOT_UTF8.search(text)
        if found is not None:
            return f"not UTF-8 text (byte 0x{ord(found.group()) - 0xDC00:02x})"
    return None


def _names_a_verdict(value: Any) -> bool:
    return isinstance(value, dict) and any(name in value for name in VERDICT_FIELDS)


def import_rows(
    session: Session, run_id: str, rows: Sequence[Row], who: str | None
) -> dict[str, Any]:
    """Store the good rows of a labels file; answer every other row's problem by line.

    A row names its claim by `item_id` and `claim_index`, or by `claim` (its text; with
    `item_id` within that item, else anywhere in the run where the text is unique), and
    carries `verdict` (or `human_verdict`: the sample file's column) and an optional `note`.
    A row whose verdict is empty is skipped (a sample file's rows left to fill in); a second
    row for a claim already labelled by this file is a problem, the first one stands.
    """
    cells = (_unescaped(r.fields.get("item_id")) for r in rows)
    keys = sorted({key for pair in cells for key in pair if key and text_problem(key) is None})
    claims: dict[int, dict[int, Claim]] = defaultdict(dict)
    by_text: dict[str, list[tuple[Item, Claim]]] = defaultdict(list)
    # rows that name a claim by its text alone: only the claims of those texts are read, not
    # every claim of the run (millions of rows for a large run, for a one-line file)
    texts = sorted(
        {
            text
            for r in rows
            if r.fields.get("item_id") in (None, "") and r.fields.get("claim_index") in (None, "")
            for text in _unescaped(r.fields.get("claim"))
            if text_problem(text) is None
        }
    )
    query = select(Item, Claim).join(Claim, Claim.item_id == Item.id).where(Item.run_id == run_id)
    items: dict[str, Item] = {}
    for start in range(0, len(keys), BIND_CHUNK):
        chunk = keys[start : start + BIND_CHUNK]
        named = select(Item).where(Item.run_id == run_id, Item.key.in_(chunk))
        items |= {item.key: item for item in session.scalars(named)}
        for item, claim in session.execute(query.where(Item.key.in_(chunk))):
            claims[item.id][claim.idx] = claim
    for start in range(0, len(texts), BIND_CHUNK):
        for item, claim in session.execute(
            query.where(Claim.text.in_(texts[start : start + BIND_CHUNK]))
        ):
            by_text[claim.text].append((item, claim))
    stored = skipped = 0
    problems: list[dict[str, Any]] = []
    seen: dict[tuple[int, int], int] = {}
    for row in rows:
        try:
            found = _row(row.fields, items, claims, by_text)
            if found is None:
                skipped += 1
                continue
            item, claim, verdict, note = found
        except LabelError as exc:
            problems.append({"line": row.line, "problem": exc.message})
            continue
        first = seen.get((item.id, claim.idx))
        if first is not None:
            problems.append(
                {"line": row.line, "problem": f"duplicate of line {first}: that row stands"}
            )
            continue
        seen[(item.id, claim.idx)] = row.line
        store_label(session, run_id, item.id, claim.idx, verdict, note, who)
        stored += 1
    return {"stored": stored, "skipped": skipped, "problems": problems}


def _row(
    fields: dict[str, Any],
    items: dict[str, Item],
    claims: dict[int, dict[int, Claim]],
    by_text: dict[str, list[tuple[Item, Claim]]],
) -> tuple[Item, Claim, str, str | None] | None:
    if not _names_a_verdict(fields):
        raise LabelError("no verdict (or human_verdict) field")
    for name, value in fields.items():
        problem = text_problem(value) if isinstance(value, str) else None
        if problem is not None:
            raise LabelError(f"{str(name)[:40]} contains {problem}")
    raw = fields.get("verdict", fields.get("human_verdict"))
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    verdict, note = check_verdict(raw), check_note(fields.get("note"))
    key, index, text = fields.get("item_id"), fields.get("claim_index"), fields.get("claim")
    if key not in (None, ""):
        item = next((items[k] for k in _unescaped(key) if k in items), None)
        if item is None:
            raise LabelError(f"no item {str(key)[:80]!r} in this run")
        if index not in (None, ""):
            position = _index(index)
            claim = claims[item.id].get(position)
            if claim is None:
                raise LabelError(f"item {item.key[:80]!r} has no claim {position}")
            return item, claim, verdict, note
        if not isinstance(text, str) or not text:
            raise LabelError("a row needs claim_index or claim")
        texts = _unescaped(text)
        matches = [c for c in claims[item.id].values() if c.text in texts]
        if not matches:
            raise LabelError(f"item {item.key[:80]!r} has no claim {text[:80]!r}")
        return item, matches[0], verdict, note
    if not isinstance(text, str) or not text:
        raise LabelError("a row needs item_id and claim_index, or claim")
    found = next((by_text[t] for t in _unescaped(text) if t in by_text), [])
    if len(found) != 1:
        why = "no claim" if not found else f"{len(found)} claims"
        raise LabelError(f"{why} of this run reads {text[:80]!r} (add item_id)")
    return found[0][0], found[0][1], verdict, note


def _unescaped(value: Any) -> tuple[str, ...]:
    """What a cell may name: itself, and for a cell our CSV made spreadsheet-safe (`'=x`) also
    the text before that (`=x`), so a sample file filled in and imported back finds its items."""
    if value in (None, ""):
        return ()
    from recallq.core.export import spreadsheet_original

    text = str(value)
    original = spreadsheet_original(text)
    return (text,) if original == text else (text, original)


def _index(value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e400 is infinity
        raise LabelError(f"claim_index must be a whole number, not {str(value)[:40]!r}") from None
    if isinstance(value, float | bool) or not 0 <= number < 2**31:
        raise LabelError(f"claim_index must be a whole number, not {str(value)[:40]!r}")
    return number
