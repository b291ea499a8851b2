"""CSV exports never hand a spreadsheet a formula to run."""

from __future__ import annotations

import csv
import io

from recallq.core import export


def _result(**fields: object) -> dict:
    base = {"id": "q1", "index": 0, "status": "succeeded", "score": 0.5, "claims": []}
    return {**base, **fields}


def test_cells_that_start_a_formula_are_escaped() -> None:
    rows = [
        _result(id='=HYPERLINK("http://evil")', reason="+1", error="-2+3"),
        _result(id="@SUM(A1)", reason="\tTAB", error="\rCR"),
        _result(id="plain", reason="a = b", error=None, score=-0.0),
    ]
    text = "".join(export.lines(rows, "csv"))
    read = list(csv.DictReader(io.StringIO(text)))
    assert [r["id"] for r in read] == ['\'=HYPERLINK("http://evil")', "'@SUM(A1)", "plain"]
    assert [r["reason"] for r in read] == ["'+1", "'\tTAB", "a = b"]
    assert [r["error"] for r in read] == ["'-2+3", "'\rCR", ""]
    assert read[2]["score"] == "-0.0"  # numbers are numbers, not text


def test_claims_csv_cells_are_escaped_too() -> None:
    claim = {
        "index": 0,
        "text": "=cmd|' /C calc'!A0",
        "verdict": "no",
        "context_indices": [],
        "reason": "@risk",
    }
    read = list(
        csv.DictReader(io.StringIO("".join(export.lines([_result(claims=[claim])], "claims.csv"))))
    )
    assert (read[0]["text"], read[0]["reason"]) == ("'=cmd|' /C calc'!A0", "'@risk")


def test_later_pages_have_no_header() -> None:
    text = "".join(export.lines([_result()], "csv", header=False))
    assert not text.startswith("id,") and text.startswith("q1,")
