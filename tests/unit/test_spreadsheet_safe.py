"""CSV exports never hand a spreadsheet a formula to run."""

from __future__ import annotations

import csv
import io

from recallq import queries


def _result(**fields: object) -> dict:
    base = {"id": "q1", "index": 0, "status": "succeeded", "score": 0.5, "claims": []}
    return {**base, **fields}


def test_cells_that_start_a_formula_are_escaped() -> None:
    rows = [
        _result(id='=HYPERLINK("http://evil")', reason="+1", error="-2+3"),
        _result(id="@SUM(A1)", reason="\tTAB", error="\rCR"),
        _result(id="plain", reason="a = b", error=None, score=-0.0),
    ]
    text = "".join(queries.csv_lines(iter(rows)))
    read = list(csv.DictReader(io.StringIO(text)))
    assert [r["id"] for r in read] == ['\'=HYPERLINK("http://evil")', "'@SUM(A1)", "plain"]
    assert [r["reason"] for r in read] == ["'+1", "'\tTAB", "a = b"]
    assert [r["error"] for r in read] == ["'-2+3", "'\rCR", ""]
    assert read[2]["score"] == "-0.0"  # numbers are numbers, not text


def test_later_pages_have_no_header() -> None:
    text = "".join(queries.csv_lines(iter([_result()]), header=False))
    assert not text.startswith("id,") and text.startswith("q1,")
