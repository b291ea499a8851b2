"""A file of labels imported: CSV or JSONL rows of `item_id, claim_index` (or `claim`),
`verdict` and `note`; every row is stored or reported as a problem with its line."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Sequence
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


@dataclass(frozen=True)
class Row:
    """One row of a labels file, by its line number (the header is line 1 of a CSV)."""

    line: int
    fields: dict[str, Any]


def parse_file(data: bytes, format: str | None = None) -> tuple[list[Row], list[dict[str, Any]]]:
    """The rows of a CSV or JSONL labels file (JSONL when the first non-blank character is
    `{`, unless `format` says), and the lines that are not rows at all."""
    if len(data) > MAX_IMPORT_BYTES:
        raise LabelError(f"a labels file may be at most {MAX_IMPORT_BYTES // 2**20} MB", 413)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise LabelError("a labels file must be UTF-8 text") from None
    if format is None:
        format = "jsonl" if text.lstrip().startswith("{") else "csv"
    rows: list[Row] = []
    problems: list[dict[str, Any]] = []
    if format == "jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):  # ValueError: an integer of 4,300+ digits
                problems.append({"line": number, "problem": "not a JSON object"})
                continue
            if not isinstance(value, dict):
                problems.append({"line": number, "problem": "not a JSON object"})
                continue
            rows.append(Row(number, value))
    else:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
            for fields in reader:
                extra = fields.pop(None, None)
                if extra:
                    problems.append({"line": reader.line_num, "problem": "more cells than columns"})
                    continue
                rows.append(Row(reader.line_num, dict(fields)))
        except csv.Error as exc:
            problems.append({"line": reader.line_num, "problem": f"not CSV: {exc}"})
    if len(rows) > MAX_IMPORT_ROWS:
        raise LabelError(f"a labels file may have at most {MAX_IMPORT_ROWS} rows", 413)
    return rows, problems


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
