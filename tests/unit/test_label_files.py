"""A labels file read row by row (recallq.labels.files.parse_file): every row of a broken file
is a row or a problem with the line it starts on; a file whose first row does not say it is a
labels file is refused whole, by the same rule the served schema states."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recallq.labels.files import CSV_HEADER_PATTERN, file_format, parse_file
from recallq.labels.store import MAX_IMPORT_BYTES, LabelError

HEADER = "item_id,claim_index,verdict,note"


@pytest.fixture(autouse=True)
def default_csv_field_limit() -> Iterator[None]:
    """The csv module's field limit as a fresh process has it (another test may have raised
    it: it is global), so a cell over it is tested as users meet it."""
    before = csv.field_size_limit(131_072)
    yield
    csv.field_size_limit(before)


def _read(text: str | bytes, format: str | None = None) -> tuple[list, list]:
    data = text.encode() if isinstance(text, str) else text
    rows, problems = parse_file(data, format)
    return [(row.line, row.fields.get("item_id")) for row in rows], problems


def test_a_quote_never_closed_loses_no_row_below_it() -> None:
    # issue 28: the quote swallowed the rest of the file into one note, with no problem
    text = f'{HEADER}\nq1,0,yes,"oops\nq2,1,no,\nq3,2,yes,fine\n'
    rows, problems = _read(text)
    assert rows == [(3, "q2"), (4, "q3")]
    assert problems == [
        {"line": 2, "problem": "not CSV: a quote opened on this line is never closed"}
    ]


def test_a_stray_quote_is_a_problem_of_its_row_and_the_rows_it_swallowed_are_read() -> None:
    text = f'{HEADER}\nq1,0,yes,"a\nq2,1,no,\nq3,2,yes,"b"x\nq4,3,no,\n'
    rows, problems = _read(text)
    assert rows == [(3, "q2"), (5, "q4")]
    assert [p["line"] for p in problems] == [2, 4]
    assert all(p["problem"].startswith("not CSV: ") for p in problems)


def test_a_cell_over_the_csv_modules_limit_is_read_and_lines_stay_right() -> None:
    # issue 28: the parse stopped there and named the wrong line
    big = "x" * 200_000
    text = f'{HEADER}\nq1,0,yes,"{big}\nstill the note"\nq2,1,no,\n'
    rows, problems = _read(text)
    assert problems == [] and rows == [(2, "q1"), (4, "q2")]
    rows_of_a_full_file, _ = _read(f"{HEADER}\nq1,0,yes,{'y' * (MAX_IMPORT_BYTES - 100)}\n")
    assert rows_of_a_full_file == [(2, "q1")]


def test_a_row_spanning_lines_is_reported_by_the_line_it_starts_on() -> None:
    text = f'{HEADER}\nq1,0,yes,"two\nlines"\nq2,1,maybe,"a\nb\nc",extra\n'
    rows, problems = _read(text)
    assert rows == [(2, "q1")]
    assert problems == [{"line": 4, "problem": "5 cells, more than the header's 4 columns"}]


def test_blank_lines_are_no_rows_and_garbage_lines_are_problems() -> None:
    text = f"\n{HEADER}\n\n   \nq1,0,yes,\ngarbage\nq2,1\nq3,2,no,,,\n"
    rows, problems = _read(text)
    assert rows == [(5, "q1"), (8, "q3")]  # empty trailing cells are no more cells
    assert problems == [
        {"line": 6, "problem": "1 cells, fewer than the header's 4 columns"},
        {"line": 7, "problem": "2 cells, fewer than the header's 4 columns"},
    ]


def test_a_line_that_is_not_utf8_is_a_problem_of_its_own() -> None:
    data = f"{HEADER}\nq1,0,yes,\n".encode() + b"q\xff2,1,no,\n" + b"q3,2,no,\n"
    rows, problems = _read(data)
    assert rows == [(2, "q1"), (4, "q3")]
    assert problems == [{"line": 3, "problem": "not UTF-8 text (byte 0xff)"}]
    jsonl = b'{"item_id": "q1", "verdict": "yes"}\n{"item_id": "\xc3("}\n{"verdict": "no"}\n'
    rows, problems = _read(jsonl)
    assert [line for line, _ in rows] == [1, 3]
    assert problems == [{"line": 2, "problem": "not UTF-8 text (byte 0xc3)"}]


def test_a_nul_in_a_cell_is_kept_for_the_row_check() -> None:
    rows, problems = _read(f"{HEADER}\nq\x001,0,yes,\n")
    assert rows == [(2, "q\x001")] and problems == []  # import_rows names its column


@pytest.mark.parametrize(
    "text",
    [
        "a,b\n1,2\n",  # issue 28: columns matching nothing were "skipped 1"
        "item_id,claim_index,note\nq1,0,\n",  # no verdict column: nothing could be stored
        "",
        "[]",
        'item_id,"verdict\nq1,yes\n',  # the header's quote never closed
        'a"b,verdict\nq1,yes\n',  # a stray quote in the header
        "verdicts,item_id\n",
    ],
)
def test_a_csv_file_whose_header_names_no_verdict_column_is_refused_whole(text: str) -> None:
    with pytest.raises(LabelError) as refused:
        parse_file(text.encode(), "csv")
    assert refused.value.status == 422
    assert refused.value.message.startswith("line 1: a CSV labels file starts with a header")
    assert re.match(CSV_HEADER_PATTERN, text) is None


@pytest.mark.parametrize(
    "text",
    [
        "not json\n",
        '{"item_id": "q1", "claim_index": 0}\n{"verdict": "yes"}\n',
        "[1, 2]\n",
        '"str"\n',
        "null\n",
    ],
)
def test_a_jsonl_file_whose_first_row_has_no_verdict_is_refused_whole(text: str) -> None:
    with pytest.raises(LabelError) as refused:
        parse_file(text.encode(), "jsonl")
    assert refused.value.status == 422 and refused.value.message.startswith("line 1: ")


def test_jsonl_lines_end_only_at_line_ends() -> None:
    row = {"item_id": "q1", "claim_index": 0, "verdict": "yes", "note": "a\u2028b\u0085c"}
    rows, problems = _read(json.dumps(row, ensure_ascii=False) + "\r\n" + "[]\r\n")
    assert rows == [(1, "q1")] and problems == [{"line": 2, "problem": "not a JSON object"}]


def test_the_format_is_read_past_a_byte_order_mark_and_blank_lines() -> None:
    assert file_format(b'\xef\xbb\xbf\n {"verdict": "yes"}') == "jsonl"
    assert file_format(b"\xef\xbb\xbfitem_id,verdict") == "csv"
    rows, _ = _read(f"\ufeff{HEADER}\nq1,0,yes,\n")
    assert rows == [(2, "q1")]


@settings(max_examples=60, suppress_health_check=list(HealthCheck), deadline=None)
@given(st.from_regex(CSV_HEADER_PATTERN, alphabet=st.characters(exclude_categories=["Cs"])))
def test_every_file_the_schema_pattern_takes_the_server_takes(text: str) -> None:
    """The pattern is the server's rule (a schema's pattern is searched for: what follows the
    header is any text): a file it matches is read by the csv module with a verdict column in
    its header, and parsed into rows and problems, not refused."""
    rows, problems = parse_file(text.encode(), "csv")
    cells = next(csv.reader(io.StringIO(text.removeprefix("\ufeff").lstrip("\r\n"), newline="")))
    assert {"verdict", "human_verdict"} & set(cells), cells
    assert all(isinstance(p["line"], int) for p in problems) and isinstance(rows, list)
